"""``python -m foxhunt``: the ``foxhunt`` command where the console script is not on ``PATH``
(a checkout on ``PYTHONPATH``, a job scheduler's ``python -m``, a debugger)."""

from foxhunt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
