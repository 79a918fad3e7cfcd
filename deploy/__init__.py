"""The processes: the agent API, the policy server, the learner, the demo, and the CLI.

OpenMP threads (torch on the CPU) spin while they wait for work by default. On a CPU shared
with other processes (the demo's three, a laptop's other jobs) a spinning thread holds a core
another process needs: a batch of 8 answers took 83 s instead of 6 s on 2 busy cores here.
Every process arloop starts imports this package before torch, so they all wait passively.

Passive with no spin at all is too slow for llama.cpp, whose OpenMP threads meet at a barrier
after every operation: each wake-up cost the policy server ~56 ms a decoding step (8 rows of
SmolLM2: 192 eval answers took 59 s against 39 s). A short spin before sleeping (libgomp's
GOMP_SPINCOUNT, tens of microseconds) keeps the barriers fast and still frees the core when a
thread has nothing to do: one gate's sampled runs took 66 s instead of 119 s. libgomp also
keeps a team of threads for every thread that ever ran torch; with one more team kept,
llama.cpp decoded at 1.25 cores instead of 1.9 (as we read libgomp, it cuts its spin short
once it manages more threads than there are cores), so the policy server loads versions on a
thread that ends (`deploy.policy_server.versions.in_own_thread`).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "30000")
