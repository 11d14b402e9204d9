#!/bin/bash
# Runs INSIDE the VM that `cargo xtask vm` boots (virtme-ng over the host's root filesystem, as
# root). Owns: the guest's preparation for the kernel-facing tests (bpffs, cgroup2, modules) and
# running the test binaries listed in the plan file given as $1. It never builds anything.
#
# Plan file: one suite per line, tab-separated: NAME, working directory, executable, then the
# libtest arguments. The host reads this script's markers (KPR-VM-*) to decide the verdict, so
# every suite is bracketed by BEGIN/END lines and the run ends with KPR-VM-DONE.
set -u
plan=${1:?usage: guest.sh PLAN_FILE}

echo "KPR-VM-KERNEL $(uname -r)"

# bpffs for the eBPF backend's pins; virtme-ng does not mount it.
if ! grep -q '^[^ ]* /sys/fs/bpf bpf ' /proc/self/mounts; then
    mount -t bpf bpf /sys/fs/bpf || echo "KPR-VM-WARN could not mount bpffs at /sys/fs/bpf"
fi
# cgroup2: virtme-ng mounts it at /sys/fs/cgroup; mount it when a future virtme does not.
if ! awk '$3 == "cgroup2" { found = 1 } END { exit !found }' /proc/self/mounts; then
    mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup ||
        echo "KPR-VM-WARN could not mount cgroup2"
fi
# Modules the backends use. Most would be autoloaded on first use; loading them here names a
# module the kernel package lacks instead of leaving a test to fail obscurely.
for module in veth sch_ingress nf_tables nf_conntrack nf_conntrack_netlink nf_nat \
    nft_chain_nat nft_ct nft_numgen nft_redir nft_tproxy nft_socket \
    ip_tables iptable_nat iptable_filter xt_conntrack xt_statistic xt_comment xt_recent; do
    modprobe -q "$module" 2>/dev/null || echo "KPR-VM-WARN module $module not loadable"
done
ip link set lo up

while IFS=$'\t' read -r -a fields; do
    [ "${#fields[@]}" -ge 3 ] || continue
    name=${fields[0]} dir=${fields[1]} exe=${fields[2]}
    args=("${fields[@]:3}")
    echo "KPR-VM-SUITE-BEGIN $name"
    (cd "$dir" && CARGO_MANIFEST_DIR=$dir "$exe" "${args[@]}" </dev/null 2>&1)
    echo "KPR-VM-SUITE-END $name exit=$?"
done <"$plan"
echo "KPR-VM-DONE"
