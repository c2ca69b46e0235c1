package hub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"fleet/store"
)

// LockName is the file in the data dir a running hub holds an exclusive
// lock on, from before it touches the database until it exits.
const LockName = "hub.lock"

// checkWritable refuses a data dir the hub cannot write, naming the cause:
// SQLite would otherwise report a read-only directory as "no such file or
// directory" when it fails to create the database next to it.
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".fleet-write-check-*")
	if err != nil {
		return fmt.Errorf("the data dir %s is read-only %s: the hub writes its database, control socket and keys there; "+
			"make it writable or pass another --data (%w)", dir, readOnlyWhy(err), err)
	}
	name := f.Name()
	f.Close()
	os.Remove(name)
	db := filepath.Join(dir, "fleet.db")
	if f, err := os.OpenFile(db, os.O_RDWR, 0); err == nil {
		f.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the database %s is read-only %s: make it writable or pass another --data (%w)", db, readOnlyWhy(err), err)
	}
	return nil
}

func readOnlyWhy(err error) string {
	if errors.Is(err, syscall.EROFS) {
		return "(a read-only file system)"
	}
	return fmt.Sprintf("for this user (uid %d)", os.Geteuid())
}

// lockedError is a data dir whose lock another process holds.
type lockedError struct{ holder, dir, path string }

func (e *lockedError) Error() string {
	return fmt.Sprintf("another hub%s is already running on data dir %s (it holds %s); nothing was changed: stop it or pass another --data",
		e.holder, e.dir, e.path)
}

// lockDataDir takes the data dir's lock without waiting, so a second hub on
// the same dir is refused before it has read or written anything. The lock
// is flock(2): the kernel drops it when the holder exits, even on kill -9.
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the data dir lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := ""
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b))); perr == nil {
				holder = fmt.Sprintf(" (pid %d)", pid)
			}
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &lockedError{holder: holder, dir: dir, path: path}
		}
		return nil, fmt.Errorf("locking the data dir %s: %w", path, err)
	}
	// The pid is for the refusal message of the next hub only; the lock,
	// not the file's content, is what excludes it.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// DataDirHolds says what the data dir keeps when the state is in
// PostgreSQL: everything but the database.
const DataDirHolds = "the hub's lock, control socket, console host key, the fleet binary simulated engines run from and local nodes' engine files"

// openStore opens the state: in PostgreSQL with a database URL, else in the
// data dir's SQLite file.
func openStore(ctx context.Context, opts Options) (*store.Store, error) {
	if opts.DatabaseURL != "" {
		st, err := store.OpenPostgres(ctx, opts.DatabaseURL, store.WithLogger(opts.Logger))
		if err != nil {
			return nil, fmt.Errorf("%w; or leave --database-url and $FLEET_DATABASE_URL unset to keep the state in the data dir", err)
		}
		opts.Logger.Info("state in PostgreSQL; the data dir keeps "+DataDirHolds, "database", st.Path(), "data", opts.DataDir)
		return st, nil
	}
	dbPath := filepath.Join(opts.DataDir, "fleet.db")
	fi, statErr := os.Stat(dbPath)
	st, err := store.Open(ctx, dbPath)
	if err != nil {
		return nil, err
	}
	if statErr == nil && fi.Size() == 0 {
		// SQLite takes a zero-length file for a new database; say so, since
		// it may be what is left of a lost one.
		opts.Logger.Warn("the database file was empty (0 bytes): initialised it as a new, empty fleet database", "path", dbPath)
	}
	return st, nil
}

// DatabaseName names the database holding the state: the SQLite file, or
// the PostgreSQL URL without its password and options.
func (h *Hub) DatabaseName() string { return h.store.Path() }
