//go:build !linux

package vip

import (
	"errors"

	"go.uber.org/zap"
)

func openLink(Config, string, *zap.Logger) (link, error) {
	return nil, errors.New("vip: floating addresses need Linux (netlink)")
}
