// Package hosts boots real systemd hosts on one Linux machine for the
// deployment test: a Debian 12 root filesystem built once with debootstrap
// and cached under /var/tmp (keyed by a hash of its package list), one
// overlay per host over it, each host a systemd-nspawn container booting its
// own systemd inside a network namespace of its own, all on one private
// bridge. A controller host reaches the others over SSH, so Ansible runs
// against them exactly as against VMs.
//
// Everything a run creates (containers, overlay mounts, namespaces, the run
// directory) is removed by Cluster.Down, and a run left behind by a killed
// test is removed by Sweep at the start of the next one.
package hosts
