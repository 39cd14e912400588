# Sourced first by each bench/*.sh script: with -h or --help it prints the script's header
# comment (what it measures, its arguments and environment) and exits.
case ${1:-} in
  -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | grep -v '^set -'; exit 0 ;;
esac
