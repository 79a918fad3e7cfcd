"""The processes: the agent API, the policy server, the learner, the demo, and the CLI.

OpenMP threads (torch on the CPU) spin while they wait for work by default. On a CPU shared
with other processes (the demo's three, a laptop's other jobs) a spinning thread holds a core
another process needs, so every process arloop starts imports this package before torch and
its threads wait passively.

Passive with no spin at all is too slow for llama.cpp, whose OpenMP threads meet at a barrier
after every operation: a short spin before sleeping (libgomp's GOMP_SPINCOUNT, tens of
microseconds) keeps those barriers fast and still frees the core when a thread has nothing to
do. libgomp also keeps a team of threads for every thread that ever ran torch, and (as we read
it) cuts its spin short once it manages more threads than there are cores, so the policy
server loads versions on a thread that ends (`deploy.policy_server.versions.in_own_thread`).
The measurements behind these choices are on the docs' figures page.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "30000")
