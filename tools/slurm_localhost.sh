#!/usr/bin/env bash
# A one-node SLURM on this machine, for `Cluster(..., launcher="slurm")` in CI (tests/runtime/
# test_launchers_slurm.py). Debian's slurm-wlm and munge: munged, slurmctld and slurmd as root,
# one node named after this host at 127.0.0.1, one partition, no cgroups (containers have none to
# spare), and more CPUs declared than the machine has (engines wait on I/O, not on cores).
#
#   tools/slurm_localhost.sh start    # install what is missing (as root, with apt), start, wait for the node
#   tools/slurm_localhost.sh stop     # stop the three daemons this script started
#
# Exits 0 with a message and starts nothing when it cannot run (not root, no apt): the test then
# skips, naming why.
set -euo pipefail
CPUS=${SLURM_CPUS:-8}
STATE=${SLURM_STATE:-/var/tmp/pipelib-slurm}
action=${1:-start}

if [ "$action" = stop ]; then
    for pidfile in "$STATE"/slurmd.pid "$STATE"/slurmctld.pid "$STATE"/munged.pid; do
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    exit 0
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian's slurm-wlm and munge"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    else
        echo "slurm-wlm not installed and cannot install it (needs root and apt): no local SLURM"; exit 0
    fi
fi
if [ "$(id -u)" != 0 ]; then echo "a local SLURM needs root here: not started"; exit 0; fi
if sinfo -h -o %T 2>/dev/null | grep -q idle; then echo "a SLURM is already up: $(sinfo -h -o '%N %T %c')"; exit 0; fi

host=$(hostname -s)
mkdir -p "$STATE"/spool/slurmd "$STATE"/spool/slurmctld /etc/slurm /run/munge /var/log/munge /var/lib/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 0400 /etc/munge/munge.key
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=pipelib
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmdSpoolDir=$STATE/spool/slurmd
StateSaveLocation=$STATE/spool/slurmctld
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
munged --force 2>/dev/null || munged
pgrep -n munged > "$STATE"/munged.pid || true
slurmctld
slurmd
for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then echo "SLURM up: $(sinfo -h -o 'node %N, %c CPUs, %T')"; exit 0; fi
    sleep 0.5
done
echo "SLURM did not come up in 30 s:"; sinfo 2>&1 || true; tail -5 "$STATE"/slurmctld.log "$STATE"/slurmd.log 2>/dev/null || true
exit 1
