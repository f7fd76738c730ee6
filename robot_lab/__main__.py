"""``python -m robot_lab`` is the ``robot-lab`` command."""

from robot_lab.cli import main

if __name__ == "__main__":
    main()
