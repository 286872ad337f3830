package syncdir

// Owner and mode from the wire are applied within the receiver's policy
// (issue 16, finding 8): a sender, stale or hostile, must not be able to
// plant a setuid-root file on the PASSIVE node.

// applyPolicy rewrites the owner and mode of q to what this receiver
// applies: the mode masked by mode-mask and stripped of setuid, setgid and
// sticky bits; the owner only with owners on, as root, and never uid or
// gid 0 unless root-owner.
func (s *Syncer) applyPolicy(q *request) {
	q.mode = s.policyMode(q.mode)
	if q.owner && !s.wantOwner(q.uid, q.gid) {
		q.owner, q.uid, q.gid = false, 0, 0
	}
}

// policyMode is the mode a file sent with mode m gets here.
func (s *Syncer) policyMode(m uint32) uint32 { return m & 0o777 & s.cfg.ModeMask }

// wantOwner reports whether a file sent with owner uid:gid gets it here.
func (s *Syncer) wantOwner(uid, gid uint32) bool {
	if !s.cfg.Owners || !canChown {
		return false
	}
	return s.cfg.RootOwner || uid != 0 && gid != 0
}
