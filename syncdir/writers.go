package syncdir

import (
	"os"

	"golang.org/x/sys/unix"
)

// noWriter reports whether nobody has the file rel open for writing, found
// by taking a read lease on it and giving it back at once: the kernel
// grants a read lease only while no descriptor is open for writing. It
// answers false when it cannot tell (the file is someone else's and roled
// lacks CAP_LEASE, leases are off, the file system has none): the caller
// then holds the file back as before.
//
// It is asked only for files the sender found without a close event (a
// reconcile, a new directory's first files, created before its watch was
// in place), which would otherwise wait holdOpen after their last write.
// A writer that opens the file during the microseconds the lease is held
// waits for its release; the lease-break signal (SIGIO) is ignored by Go.
func noWriter(root *os.Root, rel string) bool {
	f, err := root.OpenFile(rel, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	fd := int(f.Fd())
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		return false // EAGAIN: open for writing; EACCES, EINVAL: cannot tell
	}
	unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK) // Close would too
	return true
}
