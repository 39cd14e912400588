"""The load generator and what measures a serving stack around it: workloads, the runner,
results in vLLM's keys, their plots and comparisons, the stacks benchmarks start and the OpenAI
answer shapes held to vLLM's. It imports only the shared runtime (services/)."""
