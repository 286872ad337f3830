package lb

import (
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/coreos/go-systemd/v22/activation"
)

// systemd socket activation. With one socket unit per listener
// (FileDescriptorName= the listener's name, Service=hapair-lb.service; the
// Ansible role writes them), systemd owns the listening sockets and passes
// them in at every start. A restart of hapair-lb (a new binary) then closes
// nothing: connections that arrive while no process runs wait in the
// kernel's backlog and are served by the next one, instead of being refused.
//
// The sockets are taken once per process (LISTEN_FDS is for the process
// systemd started), each by the first listener that opens with its name; a
// listener re-added by a later reload binds its address itself.
var inherited = struct {
	once   sync.Once
	mu     sync.Mutex
	byName map[string]net.Listener
	err    error
}{}

func takeInherited(name string) (net.Listener, error) {
	inherited.once.Do(func() {
		inherited.byName = map[string]net.Listener{}
		all, err := activation.ListenersWithNames()
		if err != nil {
			inherited.err = err
			return
		}
		for n, ls := range all {
			if len(ls) != 1 {
				for _, l := range ls {
					_ = l.Close()
				}
				inherited.err = fmt.Errorf("systemd passed %d sockets named %q: give each listener its own socket unit", len(ls), n)
				continue
			}
			inherited.byName[n] = ls[0]
		}
	})
	inherited.mu.Lock()
	defer inherited.mu.Unlock()
	if inherited.err != nil {
		return nil, inherited.err
	}
	l := inherited.byName[name]
	delete(inherited.byName, name)
	return l, nil
}

// listen opens a listener's socket: the one systemd passed under its name
// when there is one (its address must be the configured one), else its own.
func listen(lc ListenerConfig) (net.Listener, bool, error) {
	nl, err := takeInherited(lc.Name)
	if err != nil {
		return nil, false, err
	}
	if nl == nil {
		nl, err = net.Listen("tcp", lc.Listen)
		return nl, false, err
	}
	if !sameAddr(nl.Addr(), lc.Listen) {
		_ = nl.Close()
		return nil, false, fmt.Errorf("systemd passed a socket on %s, the config says %s (the socket unit and lb.yaml disagree)", nl.Addr(), lc.Listen)
	}
	return nl, true, nil
}

// sameAddr compares a bound address with a configured host:port; an
// unspecified host (":80", "0.0.0.0:80", "[::]:80") matches any of them.
func sameAddr(bound net.Addr, want string) bool {
	ta, ok := bound.(*net.TCPAddr)
	if !ok {
		return false
	}
	w, err := net.ResolveTCPAddr("tcp", want)
	if err != nil || w.Port != ta.Port {
		return false
	}
	if len(w.IP) == 0 || w.IP.IsUnspecified() {
		return ta.IP.IsUnspecified()
	}
	return w.IP.Equal(ta.IP)
}

// unclaimedInherited names the sockets systemd passed that no listener has
// taken: connections to them would wait unanswered in the backlog.
func unclaimedInherited() []string {
	inherited.mu.Lock()
	defer inherited.mu.Unlock()
	var names []string
	for n, l := range inherited.byName {
		names = append(names, n+" ("+l.Addr().String()+")")
	}
	sort.Strings(names)
	return names
}
