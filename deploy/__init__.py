"""The processes: the agent API, the policy server, the learner, the demo, and the CLI.

OpenMP threads (torch on the CPU) spin while they wait for work by default. On a CPU shared
with other processes (the demo's three, a laptop's other jobs) a spinning thread holds a core
another process needs: a batch of 8 answers took 83 s instead of 6 s on 2 busy cores here.
Every process arloop starts imports this package before torch, so they all wait passively.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
