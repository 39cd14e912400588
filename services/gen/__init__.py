"""Generated from protos/ by `python -m meshserve.commands.codegen`; do not edit."""
