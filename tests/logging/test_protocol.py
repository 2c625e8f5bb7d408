"""The logger protocol: a missing verb fails when first reached (log_params at setup),
the optional verbs have defaults, finish and reattach are exported.
"""

import pytest
from experiments import QuietLogger, Tiny

import jaxnitro as nx


class Partial:
    """Implements only some verbs."""

    def log_params(self, params):
        self.params = params

    def log_other(self, key, value):
        pass


def test_a_missing_verb_fails_loudly_when_first_reached():
    nitro = nx.Nitro(Tiny(max_epochs=1), logger=Partial(), checkpointer=None)
    with pytest.raises(
        nx.HookError, match="The logger Partial has no `log_metrics` method"
    ):
        nitro.train()


def test_a_logger_without_log_params_fails_at_setup():
    class Silent:
        pass

    with pytest.raises(nx.HookError, match="has no `log_params` method"):
        nx.Nitro(Tiny(), logger=Silent(), checkpointer=None)


def test_optional_verbs_have_defaults():
    lg = Partial()
    assert nx.run_id(lg) is None and nx.run_url(lg) is None
    assert nx.logger_info(lg) == {} and nx.logger_state(lg) is None
    assert nx.backend(lg) is lg

    class Wrapper(Partial):
        def backend(self):
            return "native"

    assert nx.backend(Wrapper()) == "native"


def test_finish_and_reattach_are_exported():
    class Recording(QuietLogger):
        def __init__(self):
            self.calls = []

        def finish(self, status):
            self.calls.append(("finish", status))

        def reattach(self, state):
            self.calls.append(("reattach", state))

    logger = Recording()
    nx.reattach(logger, {"run": 1})
    nx.finish(logger, "completed")
    nx.finish(None, "completed")  # logging off: nothing to call
    assert logger.calls == [("reattach", {"run": 1}), ("finish", "completed")]
