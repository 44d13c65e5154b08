#!/usr/bin/env bash
# A one-node Slurm cluster for the integration tests, from Debian's packages (munge, slurmctld,
# slurmd), configured in a temporary directory for this machine's CPUs and nothing else: no system
# file is read or written. Source this file, then:
#   slurm_test_cluster_start DIR   # starts munged, slurmctld, slurmd; exports SLURM_CONF
#   slurm_test_cluster_stop DIR    # stops all three (call it from an EXIT trap)
#   slurm_test_cluster_for_test    # both for a test script (below)
# Returns 2 from start when the packages are missing or this user cannot run slurmd (not root),
# so callers can report a skip; any other failure prints the daemons' logs and returns 1.

slurm_test_cluster_missing() {
  local tool
  for tool in munged slurmctld slurmd sbatch srun squeue scontrol; do
    command -v "$tool" >/dev/null 2>&1 || [[ -x /usr/sbin/$tool ]] || { echo "$tool"; return 0; }
  done
  return 1
}

slurm_test_cluster_start() {
  local dir=$1 missing
  if missing=$(slurm_test_cluster_missing); then
    echo "slurm test cluster: $missing is not installed (scripts/setup.sh installs slurm-wlm munge)" >&2
    return 2
  fi
  if [[ $(id -u) != 0 ]]; then
    echo "slurm test cluster: slurmd must run as root to start jobs as their user" >&2
    return 2
  fi
  export PATH=$PATH:/usr/sbin
  mkdir -p "$dir"/{state,spool,munge} && chmod 0700 "$dir" "$dir/munge"
  # A fresh munge key for this cluster only: the daemons and the clients share it.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$dir/munge/munge.key"
  munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/seed" --force || { cat "$dir/munge/munged.log" >&2; return 1; }
  local host cpus mem_mb port
  host=$(hostname -s)
  cpus=$(nproc)
  mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  # Ports away from a system Slurm's 6817/6818, moved by the directory's inode so that two test
  # clusters on one machine do not collide.
  port=$(( 20000 + $(stat -c %i "$dir") % 20000 ))
  cat > "$dir/slurm.conf" <<CONF
ClusterName=sextant-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$dir/slurm.conf" || { cat "$dir/slurmctld.log" >&2; return 1; }
  slurmd -f "$dir/slurm.conf" || { cat "$dir/slurmd.log" >&2; return 1; }
  local tries
  # Up to 90 s: slurmd registers late on a machine busy with the other tests (ctest -j2).
  for tries in $(seq 1 180); do
    if sinfo -h -o %T 2>/dev/null | grep -q -E '^idle'; then return 0; fi
    sleep 0.5
  done
  echo "slurm test cluster: the node did not become idle in 90 s" >&2
  sinfo >&2; tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2
  return 1
}

slurm_test_cluster_stop() {
  local dir=$1 pidfile
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [[ -f $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null
  done
  sleep 0.5
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [[ -f $pidfile ]] && kill -9 "$(cat "$pidfile")" 2>/dev/null
  done
  return 0
}

# For a test script that sourced probe_lib.sh (its scratch $dir): the cluster in $dir/slurm,
# stopped at exit; exits 77 (skipped) when Slurm cannot run here, unless SEXTANT_REQUIRE_SLURM=1.
slurm_test_cluster_for_test() {
  trap 'slurm_test_cluster_stop "$dir/slurm"; rm -rf "$dir"' EXIT
  slurm_test_cluster_start "$dir/slurm"
  local rc=$?
  if [ "$rc" -eq 2 ] && [ "${SEXTANT_REQUIRE_SLURM:-0}" != 1 ]; then exit 77; fi
  [ "$rc" -eq 0 ] || { echo "FAIL: the test cluster did not start"; exit 1; }
}
