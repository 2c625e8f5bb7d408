"""The run file: a small declarative training language in s-expressions.

A run file names a loader, a model, an objective, an optimizer and a run
(`spec/runfile.txt`; the language reference is `docs/runfile.md`). This package
reads it (`reader`), lays it out (`fmt`), evaluates it (`evaluator`), checks its
contract (`contract`), its names (`names`), its numbers (`bounds`) and its shapes
(`check`), reads its data (`records`, `streams`), compiles it onto the engine
(`engine`, `cadence`), trains it (`running`, resuming in its run dir: `rundir`),
reads it back (`explain`), and serves the `sexpgpu` subcommands (`commands`).
It touches the engine only through `import jaxnitro`.
"""
