"""The local trace receiver: OTLP/gRPC in, recent traces kept in memory, queried by id or by
duration (protos/traces.proto). The fifth service; production uses an OpenTelemetry Collector."""
