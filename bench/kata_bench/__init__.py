"""`make bench`, split along what it measures.

Read in this order: `settings` (env vars and constants) -> `procs` (child processes,
killed by pid) -> `harness` (the private containerd, ids, set-up and clean-up) -> one module
per measurement: `startup` (ctr run echo, floor boot, and the shim's phases through
`shimlog`), `throughput` (stdout through ctr, the vsock ceiling), `exec_latency`, `memory`
(PSS of one idle sandbox), `idle` (runs those three on one idle pair), `instrumented` (runs
of their own for the figures that carry over to KVM, through `qmp`, `watch`, `devices` and
`hostcpu`; `kvm_estimate` makes their rows and the estimate), `density`, `pool` (the VM
pool: a factory of its own, start and density from it next to cold) -> `report` (table
and JSON) -> `main`. Only the Python standard library is used.
"""
