import sys

try:
    from gmlake.cli import main
except KeyboardInterrupt:                   # Ctrl-C while the command is still loading: as main() reports it
    print("gmlake: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
