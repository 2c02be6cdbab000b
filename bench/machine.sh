# Sourced by the bench scripts: `machine` prints the machine a result was measured on, for the
# first line of their output ("2 cores, AMD EPYC; 2026-11-28").
machine() {
  echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F)"
}
