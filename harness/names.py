"""What the command line and the pytest plugin name before anything heavy is imported.

``swafuzz --help``, ``swafuzz subjects`` and a usage error answer without torch or
Hypothesis (seconds on a small machine), so the exit codes and the settings profiles' names
live here, with no imports; the modules that implement them take their names from here.
"""

EXIT_OK = 0
EXIT_DIVERGENCE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3  # a bug in swafuzz, or a worker whose parent has gone
# replay: the tree does not bind the subject (git bisect run skips such a commit)
EXIT_UNTESTABLE = 125

# Hypothesis profiles are registered as swafuzz-<name>: the pytest plugin is active wherever
# swafuzz is installed, and a bare "ci" would replace a project's own profile of that name
PROFILE_PREFIX = "swafuzz-"
SETTINGS_NAMES = ("dev", "ci", "nightly", "repro", "nightly-long")
# scenario shape is not a Hypothesis setting: these profiles draw long-horizon scenarios
LONG_HORIZON_SETTINGS = frozenset({"nightly-long"})

# =0: the commands that run a subject run it in this process, unsupervised (for a debugger)
SUPERVISOR_SWITCH_ENV = "SWAFUZZ_SUPERVISOR"

# the default search budgets, in seconds: of a pull-request gate, and of one mutant's search
GATE_BUDGET_S = 120.0
MUTANT_BUDGET_S = 20.0

# where the sglang:<target> subjects bind from: a checkout, else the installed package
SGLANG_SOURCE_ENV = "SWAFUZZ_SGLANG_SOURCE"
