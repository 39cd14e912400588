"""The load generator as a library: workloads, the runner, results in vLLM's keys, their plots
and comparisons. It imports only the shared runtime (services/); `meshserve bench`, `plot` and
`compare` and the benchmark scripts use it."""
