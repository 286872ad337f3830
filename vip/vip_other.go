//go:build !linux

package vip

import "errors"

func openLink(Config, string) (link, error) {
	return nil, errors.New("vip: floating addresses need Linux (netlink)")
}
