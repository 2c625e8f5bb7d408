"""One run: its configuration, setup, state, restore, the handle and its reports."""
