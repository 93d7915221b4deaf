#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests of `fewshot sweep --executor slurm`.
# Usage (as root): scripts/slurm_cluster.sh install | start | stop | status
#   install  Debian's slurm-wlm and munge (apt-get)
#   start    a munge key, munged, slurm.conf for this machine's cores and memory, slurmctld and
#            slurmd; waits until a job runs
#   stop     cancels every job and stops the daemons
# No systemd, no accounting database (submitit does without sacct), no cgroups: processes are
# tracked by their parent, which is all one node of tests needs.
set -euo pipefail
CONF=/etc/slurm/slurm.conf
STATE=/var/spool/fewshot-slurm
NODE=$(hostname -s)

install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
}

start() {
    command -v slurmctld >/dev/null || { echo "slurm is not installed: $0 install" >&2; exit 2; }
    mkdir -p /etc/munge /var/log/munge /run/munge "$STATE/ctld" "$STATE/d" /etc/slurm
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /var/log/munge /run/munge
    chmod 0400 /etc/munge/munge.key
    pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
    # The node as the machine is: its cores and most of its memory (MB).
    local cpus memory
    cpus=$(nproc)
    memory=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
    cat >"$CONF" <<EOF
ClusterName=fewshot
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits out its credential's lifetime (120 s by default) before it starts again.
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
KillWait=30
NodeName=$NODE CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    pgrep -x slurmctld >/dev/null || slurmctld -c
    pgrep -x slurmd >/dev/null || slurmd
    # Ready when a job runs to its end.
    for _ in $(seq 60); do
        if scontrol ping >/dev/null 2>&1 && srun --immediate=5 -N1 true >/dev/null 2>&1; then
            echo "slurm: one node ($NODE, $cpus cores, $memory MB) ready"
            return 0
        fi
        scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    echo "slurm did not start: see $STATE/slurmctld.log and $STATE/slurmd.log" >&2
    exit 1
}

stop() {
    scancel --full --quiet --user=root 2>/dev/null || true
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    pkill -x munged 2>/dev/null || true
    for _ in $(seq 50); do  # gone before a start that follows looks for them
        pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null ||
            pgrep -x munged >/dev/null || break
        sleep 0.2
    done
    rm -rf "$STATE"
}

status() {
    sinfo --noheader 2>/dev/null || { echo "slurm is not running" >&2; exit 1; }
}

case "${1:-}" in
    install | start | stop | status) "$1" ;;
    *) echo "usage: $0 install | start | stop | status" >&2; exit 2 ;;
esac
