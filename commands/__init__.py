"""The command-line tools: `meshserve` and its subcommands (run the mesh, a request, a benchmark,
the live view, traces, code generation). They use the services; no service imports them."""
