"""``python -m swafuzz``: the same as the ``swafuzz`` command."""

from .entry import entry

# the guard matters: worker processes started with "spawn" import this module again
if __name__ == "__main__":
    entry()
