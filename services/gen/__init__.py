"""Generated from protos/ by `python -m services.codegen`; do not edit."""
