"""The agent tools: `nitro mcp`, an MCP server exposing `nitro_*` tools.

`loader` (experiments named `file.py:ClassName`, resolved under the server's root),
`registry` (background runs on threads), `tools` (the tool functions, without the
SDK), `server` (the `mcp` SDK server and `serve`). It sits above `run/` and `loop/`,
and nothing else in the package imports it.
"""
