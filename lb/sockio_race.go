//go:build race

package lb

import "syscall"

// Race builds use the annotated system calls, so the race detector still
// sees the ordering that socket I/O implies between goroutines.

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}

func epollWait(fd uintptr, evs []syscall.EpollEvent) (int, syscall.Errno) {
	n, err := syscall.EpollWait(int(fd), evs, 0)
	return max(n, 0), errnoOf(err)
}
