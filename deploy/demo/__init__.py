"""`arloop demo`: the processes, simulated users, rounds and the report."""
