"""Where skill scripts and the workspace tools run: bubblewrap confinement, the operator's
ceiling, process and memory limits, the reaper, and each conversation's workspace with its
quota. Used by the skill bundles (:mod:`robot_lab.skills`) and by robots without skills
(the workspace tools); it imports only foundation and ``schemas``. See docs/skills.md,
"The sandbox".
"""
