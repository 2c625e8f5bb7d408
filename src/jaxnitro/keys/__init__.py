"""Keys: what identifies a compiled program and the code it runs.

The code fingerprint (`fingerprint`), the test of which code is the user's
(`library_code`) and the compile cache's key (`program_key`). They sit below the
experiment, which fingerprints its hooks when a handle freezes them, and below every
layer that keys a program or an optimizer rule; they import nothing of jaxnitro but
its errors.
"""
