// Package proc runs the child processes of end-to-end tests and benchmarks
// (lsync daemons): started with their output appended to a log file,
// killed with the process that started them however it ends, and stopped
// by their PID.
package proc

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Proc is a started child process.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts cmd with its stdout and stderr appended to logPath. The
// child gets SIGKILL when this process dies (cmd's other SysProcAttr
// settings, such as a Credential, are kept).
func Start(cmd *exec.Cmd, logPath string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Go sets the signal after changing the user, which would clear it;
	// it is set here all the same, and holds for an unchanged user.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill9 sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill9() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to grace, then SIGKILL; it reports
// whether the process ended by itself within grace.
func (p *Proc) Stop(grace time.Duration) bool {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return true
	case <-time.After(grace):
		p.Kill9()
		return false
	}
}
