# Sourced by the cluster tests: "hosts" on this machine, each a network namespace with its own
# address on a private bridge and its own /etc/hosts naming all of them (`ip netns exec` and
# with_slurm.sh's nsenter put /etc/netns/<namespace>/hosts over /etc/hosts), and the check of
# a job's final accuracy.

hosts_prefix=""
hosts_names=()

# make_hosts PREFIX SUBNET NAME...: namespace PREFIX<NAME> at SUBNET.<1 + its index> (SUBNET as
# "10.214.0"), known there and on every other host as NAME; PREFIXbr holds the bridge.
make_hosts() {
  hosts_prefix=$1
  local subnet=$2
  shift 2
  hosts_names=("$@")
  local p=$hosts_prefix i h k
  ip netns add "${p}br"
  ip -n "${p}br" link add br0 type bridge
  ip -n "${p}br" link set br0 up
  for i in "${!hosts_names[@]}"; do
    h=${hosts_names[$i]}
    ip netns add "$p$h"
    ip -n "$p$h" link add eth0 type veth peer name "v$i"
    ip -n "$p$h" link set "v$i" netns "${p}br"
    ip -n "${p}br" link set "v$i" master br0
    ip -n "${p}br" link set "v$i" up
    ip -n "$p$h" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$p$h" link set eth0 up
    ip -n "$p$h" link set lo up
    mkdir -p "/etc/netns/$p$h"
    { echo "127.0.0.1 localhost"; for k in "${!hosts_names[@]}"; do echo "$subnet.$((k + 1)) ${hosts_names[$k]}"; done; } \
      > "/etc/netns/$p$h/hosts"
  done
}

# Removes what make_hosts made (safe to call twice, or when it made nothing).
remove_hosts() {
  local h
  for h in "${hosts_names[@]}"; do
    ip netns del "$hosts_prefix$h" 2>/dev/null || true
    rm -rf "/etc/netns/$hosts_prefix$h"
  done
  [[ -n $hosts_prefix ]] && ip netns del "${hosts_prefix}br" 2>/dev/null
  hosts_names=()
  return 0
}

# final_accuracy_at_least OUTPUT MIN: worker 0's final test accuracy in OUTPUT is at least MIN
# percent (prints it; fails the test otherwise).
final_accuracy_at_least() {
  local acc
  acc=$(grep -ao 'final test_acc *[0-9.]*%' "$1" | head -1 | grep -o '[0-9.]*%' | tr -d %)
  [[ -n $acc ]] || fail "$1: no final accuracy"
  awk -v a="$acc" -v m="$2" 'BEGIN { exit !(a >= m) }' || fail "$1: final accuracy $acc% < $2%"
  echo "   final accuracy $acc%"
}

# missing WHAT: a prerequisite of one leg of a test is missing. Under CI=true (CI must run every
# leg) that fails the test; elsewhere the leg is skipped, saying so.
missing() {
  if [[ ${CI:-} == true ]]; then
    echo "FAIL: $* (CI=true: a missing prerequisite fails)" >&2
    exit 1
  fi
  echo "== skipped: $*"
}
