"""Generated from protos/ by `python -m commands.codegen`; do not edit."""
