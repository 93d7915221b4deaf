"""Names vulture cannot see used: read by a framework or by name, not by a call in our code."""

# vulture only parses this file, never runs it: any object can stand for the attribute reads.
_ = object()

# Protocol signatures: signal handlers take (signum, frame), __exit__ takes the exception triple.
_.frame
_.exc

# hubconf.py: torch.hub reads `dependencies` and calls the entry points by name.
_.dependencies
_.protonet_conv4_omniglot
_.maml_conv4_omniglot
_.fomaml_conv4_omniglot
_.anil_conv4_omniglot
_.imaml_conv4_omniglot
_.matching_conv4_omniglot
_.relation_conv4_omniglot

# Result dataclass fields that reach JSON through dataclasses.asdict and are read by key there.
_.train_acc  # fewshot.evaluation.metrics.MetricsRow
_.seconds_total  # fewshot.hpo.tasks.cleaning.CleaningResult
_.wall_seconds  # fewshot.hpo.tasks.regularization.RegularizationResult

# pytest reads `pytestmark`; these fixtures are requested only for their side effects.
_.pytestmark
_.finetune
_.fresh_resolution

# pytest (and pytest-xdist) call these conftest hooks by name.
_.pytest_terminal_summary
_.pytest_configure
_.pytest_unconfigure
_.pytest_collection_modifyitems
_.pytest_runtest_logstart
_.pytest_runtest_logfinish
_.location  # their signature: pytest passes it by name

# http.server calls a request handler's do_<METHOD> and log_message (tests/test_fetch.py's server).
_.do_GET
_.log_message

# Python calls a module's __getattr__ and __dir__ by name (PEP 562: the lazily imported API).
_.__getattr__
_.__dir__
