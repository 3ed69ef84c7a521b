"""The scenario profiles by name, importable without torch or Hypothesis (the command line
offers them before it imports anything heavy); :mod:`swafuzz.strategies.scenarios` says
what each one draws."""

REALISTIC = "realistic"
ADVERSARIAL = "adversarial"
PROFILES = (REALISTIC, ADVERSARIAL)
