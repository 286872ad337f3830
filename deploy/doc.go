// Package deploy holds what operators deploy and watch hapair with, outside
// the Go binaries: Prometheus alert rules (prometheus/hapair.rules.yml and
// their promtool unit tests), the Grafana dashboard (grafana/hapair.json).
// The Ansible roles live in ../ansible.
//
// The package has no Go code of its own. Its tests are the checks of both
// directories: ansible-lint and syntax checks, a converge test applying the
// playbooks for real to several inventory hosts confined under temp roots,
// promtool check/test rules, and the dashboard's metric names against the
// names the binaries' code exports. Each skips, naming the Debian package,
// when its tool (ansible, ansible-lint, prometheus, systemd) is missing.
package deploy
