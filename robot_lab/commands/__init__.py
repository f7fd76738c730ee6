"""Subcommands of ``robot-lab``, one module per topic, loaded lazily by :mod:`robot_lab.cli`."""
