//! The local-directory object store, nova's embedded default: objects are files under a
//! root directory, written crash-safe, so a put that returned is durable and a crash
//! leaves every key either absent, whole-old or whole-new, never partial.
//!
//! Layout under the root (the `~` never occurs in a key, so the store's own names can
//! never collide with an object's):
//!
//! ```text
//! <root>/~lock                       held (flock) while a store has the root open
//! <root>/~tmp/<pid>-<n>              a put being written; emptied at open
//! <root>/a/b/c~                      the object with key `a/b/c`
//! ```
//!
//! A key's segments but the last are directories, the last is a file named `<segment>~`.
//! The marker lets `a` and `a/b` both exist (file `a~` next to directory `a`), as on S3.
//!
//! A put writes `~tmp/<pid>-<n>` (with O_DIRECT from 64 KiB on, from the caller's bytes
//! when they start 4 KiB-aligned, else from aligned staging memory: a buffered write
//! costs more CPU in page-cache copies than the shards can spare), fsyncs it, then
//! renames it over the object (overwrite) or hard-links it to the object name
//! (create-only: `link` fails if the name exists, so of racing create-only puts exactly
//! one wins), then fsyncs the object's directory. A directory the store creates is made
//! durable by fsyncing its parent before anything is put in it. A get of 64 KiB or more
//! reads with O_DIRECT too, into aligned memory it returns as it is.
//!
//! The file work is blocking `std::fs` on tokio's blocking pool, at most
//! `--local-store-io-concurrency` calls at once; it never runs on the caller's thread.
//! This module owns the files under its root; it never follows a key outside it (keys
//! have no `..` and no leading `/`) and never removes a directory.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use tokio::sync::Semaphore;

use crate::error::{Cause, Error, Op};
use crate::key::SEGMENT_BYTES_MAX;
use crate::range::ByteRange;
use crate::{
    BoxFuture, ListPage, ObjectMeta, ObjectStore, PutCondition, check_get_args, check_key_for,
    check_list_args,
};

/// The marker that ends an object's file name.
const OBJECT_MARKER: char = '~';
/// The directory of puts in progress.
const TMP_DIR: &str = "~tmp";
/// The file a store holds an exclusive lock on while it has the root open.
const LOCK_FILE: &str = "~lock";
/// Directories remembered as durable; past this the memory is dropped and directories
/// are fsynced again on first use (correct, just one fsync more each).
const DURABLE_DIRS_MAX: usize = 65_536;

/// Options of a [`LocalDirStore`]; [`Default`] is every knob's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalDirOptions {
    /// Calls doing file work at once (`--local-store-io-concurrency`).
    pub io_concurrency: usize,
    /// The largest single write of an object (`--local-store-write-bytes`).
    pub write_bytes: usize,
}

impl Default for LocalDirOptions {
    fn default() -> Self {
        Self {
            io_concurrency: usize::try_from(tuning::LOCAL_STORE_IO_CONCURRENCY.default)
                .unwrap_or(usize::MAX),
            write_bytes: usize::try_from(tuning::LOCAL_STORE_WRITE_BYTES.default)
                .unwrap_or(usize::MAX),
        }
    }
}

/// The object store on a local directory. Cheap to clone; clones share the root.
#[derive(Clone, Debug)]
pub struct LocalDirStore {
    inner: Arc<Inner>,
    permits: Arc<Semaphore>,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    tmp: PathBuf,
    /// Held for the store's life: two processes writing one root would empty each
    /// other's `~tmp`.
    _lock: File,
    /// Directories under the root known to be durable (their parent was fsynced after
    /// they were made, or they were found so). Bounded by [`DURABLE_DIRS_MAX`].
    durable_dirs: Mutex<HashSet<PathBuf>>,
    next_temp: AtomicU64,
    /// The largest single write of an object (`--local-store-write-bytes`).
    write_bytes: usize,
}

impl LocalDirStore {
    /// Opens (creating it if needed) the store rooted at `root`: takes the root's lock
    /// (refused when another store has it open), and removes what interrupted puts
    /// left in `~tmp`. Blocking file work: call it at start-up, off any reactor.
    pub fn open(root: impl Into<PathBuf>, options: LocalDirOptions) -> Result<Self, Error> {
        let root = root.into();
        let name = root.display().to_string();
        let fail = |cause| Error::new(Op::Open, &name, cause);
        if options.io_concurrency == 0 {
            return Err(fail(Cause::Config(
                "--local-store-io-concurrency: at least one call at a time".into(),
            )));
        }
        if options.write_bytes < DIRECT_ALIGN {
            return Err(fail(Cause::Config(format!(
                "--local-store-write-bytes {}: at least {DIRECT_ALIGN} (one block)",
                options.write_bytes
            ))));
        }
        fs::create_dir_all(&root).map_err(|err| fail(Cause::Io(err)))?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent).map_err(|err| fail(Cause::Io(err)))?;
        }
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(LOCK_FILE))
            .map_err(|err| fail(Cause::Io(err)))?;
        lock.try_lock().map_err(|err| {
            fail(match err {
                fs::TryLockError::WouldBlock => Cause::Config(format!(
                    "another object store has {} open (its {LOCK_FILE} is locked)",
                    root.display()
                )),
                fs::TryLockError::Error(err) => Cause::Io(err),
            })
        })?;
        let tmp = root.join(TMP_DIR);
        match fs::create_dir(&tmp) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                for entry in fs::read_dir(&tmp).map_err(|err| fail(Cause::Io(err)))? {
                    let entry = entry.map_err(|err| fail(Cause::Io(err)))?;
                    remove_if_present(&entry.path()).map_err(|err| fail(Cause::Io(err)))?;
                }
            }
            Err(err) => return Err(fail(Cause::Io(err))),
        }
        sync_dir(&root).map_err(|err| fail(Cause::Io(err)))?;
        let inner = Inner {
            root,
            tmp,
            _lock: lock,
            durable_dirs: Mutex::new(HashSet::new()),
            next_temp: AtomicU64::new(0),
            write_bytes: options.write_bytes,
        };
        Ok(Self {
            inner: Arc::new(inner),
            permits: Arc::new(Semaphore::new(options.io_concurrency)),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Runs `work` on the blocking pool once a permit is free. The permit travels with
    /// the work, so a caller that gives up waiting does not free a slot that is still
    /// busy.
    async fn run<T: Send + 'static>(
        &self,
        op: Op,
        key: &str,
        work: impl FnOnce(&Inner) -> Result<T, Cause> + Send + 'static,
    ) -> Result<T, Error> {
        let permit = Arc::clone(&self.permits).acquire_owned().await.map_err(|_| {
            Error::new(op, key, Cause::TaskFailed("the store's permits closed".into()))
        })?;
        let inner = Arc::clone(&self.inner);
        let joined = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work(&inner)
        })
        .await;
        match joined {
            Ok(result) => result.map_err(|cause| Error::new(op, key, cause)),
            Err(err) => Err(Error::new(op, key, Cause::TaskFailed(err.to_string()))),
        }
    }
}

impl ObjectStore for LocalDirStore {
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        condition: PutCondition,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            check_key_for(Op::Put, key)?;
            let owned = key.to_owned();
            self.run(Op::Put, key, move |inner| inner.put(&owned, &bytes, condition)).await
        })
    }

    fn get<'a>(&'a self, key: &'a str, range: ByteRange) -> BoxFuture<'a, Result<Bytes, Error>> {
        Box::pin(async move {
            check_get_args(key, &range)?;
            let owned = key.to_owned();
            self.run(Op::Get, key, move |inner| inner.get(&owned, &range)).await
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        Box::pin(async move {
            check_key_for(Op::Head, key)?;
            let owned = key.to_owned();
            self.run(Op::Head, key, move |inner| inner.head(&owned)).await
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage, Error>> {
        Box::pin(async move {
            check_list_args(prefix, start_after, limit)?;
            let owned_prefix = prefix.to_owned();
            let owned_after = start_after.map(str::to_owned);
            self.run(Op::List, prefix, move |inner| {
                inner.list(&owned_prefix, owned_after.as_deref(), limit)
            })
            .await
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            check_key_for(Op::Delete, key)?;
            let owned = key.to_owned();
            self.run(Op::Delete, key, move |inner| inner.delete(&owned)).await
        })
    }
}

/// A temporary file that is removed unless it was handed over.
struct TempFile<'a> {
    path: &'a Path,
    armed: bool,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: a leftover is removed at the next open anyway.
            let _ = fs::remove_file(self.path);
        }
    }
}

impl Inner {
    /// The object's directory and file name. `key` passed `check_key`.
    fn locate(&self, key: &str) -> (PathBuf, String) {
        let (dirs, name) = key.rsplit_once('/').unwrap_or(("", key));
        let mut dir = self.root.clone();
        dir.extend(dirs.split('/').filter(|segment| !segment.is_empty()));
        (dir, format!("{name}{OBJECT_MARKER}"))
    }

    fn put(&self, key: &str, bytes: &[u8], condition: PutCondition) -> Result<(), Cause> {
        let (dir, name) = self.locate(key);
        self.make_durable_dirs(key).map_err(Cause::Io)?;
        let temp_path = self.tmp.join(format!(
            "{}-{}",
            std::process::id(),
            self.next_temp.fetch_add(1, Ordering::Relaxed)
        ));
        let mut temp = TempFile { path: &temp_path, armed: true };
        let file = write_new(&temp_path, bytes, self.write_bytes).map_err(Cause::Io)?;
        file.sync_all().map_err(Cause::Io)?;
        drop(file);
        let target = dir.join(name);
        match condition {
            PutCondition::Overwrite => {
                fs::rename(&temp_path, &target).map_err(Cause::Io)?;
                temp.armed = false;
            }
            PutCondition::CreateOnly => match fs::hard_link(&temp_path, &target) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(Cause::AlreadyExists);
                }
                Err(err) => return Err(Cause::Io(err)),
            },
        }
        // The object is in place; the new name is durable after this.
        sync_dir(&dir).map_err(Cause::Io)?;
        Ok(())
    }

    /// Creates the directories of `key` that are missing, and makes each one durable
    /// (its parent fsynced) before it is used, whoever created it: a directory made by
    /// a concurrent put may not be durable yet.
    fn make_durable_dirs(&self, key: &str) -> io::Result<()> {
        let Some((dirs, _)) = key.rsplit_once('/') else { return Ok(()) };
        let mut path = self.root.clone();
        for segment in dirs.split('/') {
            let parent = path.clone();
            path.push(segment);
            if self.durable_dirs.lock().unwrap_or_else(PoisonError::into_inner).contains(&path) {
                continue;
            }
            match fs::create_dir(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(err),
            }
            sync_dir(&parent)?;
            let mut durable = self.durable_dirs.lock().unwrap_or_else(PoisonError::into_inner);
            if durable.len() >= DURABLE_DIRS_MAX {
                durable.clear();
            }
            durable.insert(path.clone());
        }
        Ok(())
    }

    fn get(&self, key: &str, range: &ByteRange) -> Result<Bytes, Cause> {
        let (dir, name) = self.locate(key);
        let mut file = File::open(dir.join(name)).map_err(not_found_or_io)?;
        let size = file.metadata().map_err(Cause::Io)?.len();
        let Some(span) = range.resolve(size) else {
            return Err(Cause::RangeNotSatisfiable { range: range.to_string(), size });
        };
        let len = span.end - span.start;
        let capacity = usize::try_from(len)
            .map_err(|_| Cause::TooLarge { size: len, max: usize::MAX as u64 })?;
        if capacity >= DIRECT_MIN_BYTES
            && let Some(bytes) =
                read_direct(&file, span.clone(), self.write_bytes).map_err(Cause::Io)?
        {
            return Ok(bytes);
        }
        let mut buffer = Vec::with_capacity(capacity);
        file.seek(SeekFrom::Start(span.start)).map_err(Cause::Io)?;
        file.take(len).read_to_end(&mut buffer).map_err(Cause::Io)?;
        // Objects are replaced by rename, never changed in place, so an open file keeps
        // its size; a shorter read means the file system lost bytes.
        if buffer.len() as u64 != len {
            return Err(Cause::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read {} of {len} bytes", buffer.len()),
            )));
        }
        Ok(Bytes::from(buffer))
    }

    fn head(&self, key: &str) -> Result<Option<u64>, Cause> {
        let (dir, name) = self.locate(key);
        match fs::metadata(dir.join(name)) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(err) if is_absent(&err) => Ok(None),
            Err(err) => Err(Cause::Io(err)),
        }
    }

    fn delete(&self, key: &str) -> Result<(), Cause> {
        let (dir, name) = self.locate(key);
        match fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(err) if is_absent(&err) => {
                if !dir.is_dir() {
                    return Ok(());
                }
            }
            Err(err) => return Err(Cause::Io(err)),
        }
        // Also when the file was already gone: a concurrent delete may not have made
        // the removal durable yet, and this one must not return before it is.
        sync_dir(&dir).map_err(Cause::Io)
    }

    fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<ListPage, Cause> {
        let mut scan = Scan { prefix, start_after, limit, objects: Vec::new(), more: false };
        scan.walk(&self.root, "").map_err(Cause::Io)?;
        let next =
            if scan.more { scan.objects.last().map(|object| object.key.clone()) } else { None };
        Ok(ListPage { objects: scan.objects, next })
    }
}

/// One listing: a depth-first walk that visits keys in ascending byte order, skips
/// subtrees wholly before `start_after` or outside `prefix`, and stops one key past the
/// page (to know whether there is a next page).
struct Scan<'a> {
    prefix: &'a str,
    start_after: Option<&'a str>,
    limit: usize,
    objects: Vec<ObjectMeta>,
    more: bool,
}

enum Entry {
    Dir(PathBuf),
    Object(PathBuf),
}

impl Scan<'_> {
    /// Walks `dir`, whose keys all start with `key_prefix` (`""` or ending in `/`).
    /// Returns `false` once the page is full.
    fn walk(&mut self, dir: &Path, key_prefix: &str) -> io::Result<bool> {
        // Each entry sorts by the shortest string every key under it starts with: a
        // directory `d` by `d/`, an object file `f~` by its key `f`. Neither of two
        // such strings is a prefix of the other unless an object `d` sits next to a
        // directory `d` (and `d` < `d/...`), so this order is the keys' order.
        let mut entries = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else { continue };
            let kind = entry.file_type()?;
            if kind.is_dir() && is_key_segment(&name) {
                entries.push((format!("{key_prefix}{name}/"), Entry::Dir(entry.path())));
            } else if kind.is_file()
                && let Some(segment) = name.strip_suffix(OBJECT_MARKER)
                && is_key_segment(segment)
            {
                entries.push((format!("{key_prefix}{segment}"), Entry::Object(entry.path())));
            }
            // Anything else (the store's own files, strangers) is not an object.
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, entry) in entries {
            let prefix = self.prefix;
            if key.as_str() > prefix && !key.starts_with(prefix) {
                // Sorted: every later entry is past the prefix too.
                break;
            }
            match entry {
                Entry::Dir(path) => {
                    let overlaps_prefix = key.starts_with(prefix) || prefix.starts_with(&key);
                    // Every key under `key` sorts before `after` unless `after` is
                    // under `key` itself.
                    let wholly_before = self
                        .start_after
                        .is_some_and(|after| key.as_str() < after && !after.starts_with(&key));
                    if overlaps_prefix && !wholly_before && !self.walk(&path, &key)? {
                        return Ok(false);
                    }
                }
                Entry::Object(path) => {
                    if !key.starts_with(prefix)
                        || self.start_after.is_some_and(|after| key.as_str() <= after)
                    {
                        continue;
                    }
                    let size = match fs::metadata(&path) {
                        Ok(meta) => meta.len(),
                        // Deleted since the directory was read.
                        Err(err) if is_absent(&err) => continue,
                        Err(err) => return Err(err),
                    };
                    if self.objects.len() == self.limit {
                        self.more = true;
                        return Ok(false);
                    }
                    self.objects.push(ObjectMeta { key, size });
                }
            }
        }
        Ok(true)
    }
}

/// Whether a file name can be a key segment (and so is not one of the store's own).
fn is_key_segment(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= SEGMENT_BYTES_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
}

/// A lookup that failed because the object is not there: the file is missing, or a
/// directory on its path is missing or is a file.
fn is_absent(err: &io::Error) -> bool {
    matches!(err.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}

fn not_found_or_io(err: io::Error) -> Cause {
    if is_absent(&err) { Cause::NotFound } else { Cause::Io(err) }
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// Makes the entries of directory `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Objects from this size on are written with O_DIRECT.
const DIRECT_MIN_BYTES: usize = 64 << 10;
/// O_DIRECT's alignment of memory, file offset and length on the file systems nova
/// runs on (4 KiB logical blocks).
const DIRECT_ALIGN: usize = 4096;

std::thread_local! {
    /// Each blocking-pool thread's aligned staging memory for O_DIRECT writes, kept
    /// between puts (at most the largest object it wrote, and at most
    /// `--local-store-io-concurrency` threads write at once).
    static STAGING: std::cell::RefCell<Staging> = const { std::cell::RefCell::new(Staging::EMPTY) };
}

/// A 4 KiB-aligned allocation, zeroed when it grows.
struct Staging {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl Staging {
    const EMPTY: Staging = Staging { ptr: std::ptr::NonNull::dangling(), len: 0 };

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len, DIRECT_ALIGN).expect("a valid aligned layout")
    }

    /// At least `len` bytes (a multiple of the alignment), as a slice.
    fn get(&mut self, len: usize) -> &mut [u8] {
        if self.len < len {
            self.release();
            // SAFETY: the layout has a non-zero size (callers ask for whole blocks, at
            // least one).
            let raw = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
            let Some(ptr) = std::ptr::NonNull::new(raw) else {
                std::alloc::handle_alloc_error(Self::layout(len))
            };
            self.ptr = ptr;
            self.len = len;
        }
        // SAFETY: `ptr` is a live, zero-initialised allocation of `self.len >= len` bytes
        // owned by this value, and the borrow of `self` keeps it from being released.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len) }
    }

    fn release(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `get` with this very layout, and not released since.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
            // Fields, not `*self = ...`, which would drop (and release) the old value.
            self.ptr = std::ptr::NonNull::dangling();
            self.len = 0;
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.release();
    }
}

/// Reads `span` of `file` with O_DIRECT (switched on for the open file, so it is the very
/// file whose size the caller checked), from the block the span starts in to the block
/// it ends in, into 4 KiB-aligned memory, and returns the span's bytes where they
/// landed: no page cache and no copy. A buffered read of history just written with
/// O_DIRECT (a settle reading back a transit bundle) filled the page cache and copied out
/// of it, the local store's largest CPU cost under a sustained express load (perf).
/// The reads go one piece of at most `piece_bytes` (whole blocks) at a time, as writes
/// do, so the disk's queue never holds much of one read ahead of the journal's writes.
/// `None` where the file system refuses O_DIRECT (tmpfs before Linux 6.6).
fn read_direct(
    file: &File,
    span: std::ops::Range<u64>,
    piece_bytes: usize,
) -> io::Result<Option<Bytes>> {
    use std::os::fd::AsRawFd as _;
    let fd = file.as_raw_fd();
    // SAFETY: plain fcntl calls on a descriptor `file` keeps open.
    let switched = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags != -1 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) != -1
    };
    if !switched {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::EINVAL) { Ok(None) } else { Err(err) };
    }
    let align = DIRECT_ALIGN as u64;
    let first = span.start / align * align;
    let blocks_end = span.end.div_ceil(align) * align;
    let too_large = |_| io::Error::other(format!("a read of {span:?} does not fit in memory"));
    let skip = usize::try_from(span.start - first).map_err(too_large)?;
    let need = usize::try_from(span.end - first).map_err(too_large)?;
    let mut memory = DirectRead::new(usize::try_from(blocks_end - first).map_err(too_large)?);
    let piece_bytes = (piece_bytes / DIRECT_ALIGN * DIRECT_ALIGN).max(DIRECT_ALIGN);
    while memory.filled < need {
        let at = memory.filled;
        let ask = (memory.capacity - at).min(piece_bytes);
        let offset = libc::off_t::try_from(first + at as u64).map_err(io::Error::other)?;
        // SAFETY: `at..at + ask` lies within the allocation `memory` owns (`ask` is at
        // most `capacity - at`); the kernel writes at most `ask` bytes there, and
        // nothing reads them before `filled` says they were written.
        let read = unsafe { libc::pread(fd, memory.ptr.as_ptr().add(at).cast(), ask, offset) };
        match read {
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            -1 => return Err(io::Error::last_os_error()),
            0 => break,
            n => memory.filled += n as usize,
        }
        // Only the end of the file reads short: a read never resumes off a block.
        if !memory.filled.is_multiple_of(DIRECT_ALIGN) {
            break;
        }
    }
    if memory.filled < need {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read {} of {} bytes", memory.filled.saturating_sub(skip), need - skip),
        ));
    }
    Ok(Some(Bytes::from_owner(memory).slice(skip..need)))
}

/// A 4 KiB-aligned allocation an O_DIRECT read landed in; its first `filled` bytes are
/// what the kernel wrote, the only ones it shows.
struct DirectRead {
    ptr: std::ptr::NonNull<u8>,
    capacity: usize,
    filled: usize,
}

// SAFETY: the allocation is owned by this value alone and only read through `&self`.
unsafe impl Send for DirectRead {}
// SAFETY: shared access only reads the written bytes.
unsafe impl Sync for DirectRead {}

impl DirectRead {
    /// `capacity` bytes (a non-zero multiple of the alignment), none of them written.
    fn new(capacity: usize) -> Self {
        let layout = Staging::layout(capacity);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        Self { ptr, capacity, filled: 0 }
    }
}

impl AsRef<[u8]> for DirectRead {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were written by `pread` and are owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.filled) }
    }
}

impl Drop for DirectRead {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout, and freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Staging::layout(self.capacity)) };
    }
}

/// Writes `bytes` to a new file at `path`. Large objects go with O_DIRECT: a buffered
/// write spends more CPU copying into the page cache (and allocating it) than a copy to
/// aligned memory costs, CPU the shards need. Bytes that start 4 KiB-aligned (the engine
/// assembles bundles and settled objects so) are written from where they are, all but
/// the last partial block; anything else is staged in aligned memory first. Either way
/// the writes go one piece of at most `write_bytes` (whole blocks) at a time, so the
/// disk's queue never holds much of one object ahead of the journal's writes. Where the
/// file system refuses O_DIRECT (tmpfs), it writes through the page cache.
fn write_new(path: &Path, bytes: &[u8], write_bytes: usize) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let piece_bytes = write_bytes / DIRECT_ALIGN * DIRECT_ALIGN;
    let write_pieces = |file: &mut File, bytes: &[u8]| {
        bytes.chunks(piece_bytes).try_for_each(|piece| file.write_all(piece))
    };
    if bytes.len() >= DIRECT_MIN_BYTES {
        let direct = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        match direct {
            Ok(mut file) => {
                let direct = if (bytes.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
                    bytes.len() / DIRECT_ALIGN * DIRECT_ALIGN
                } else {
                    0
                };
                write_pieces(&mut file, &bytes[..direct])?;
                let rest = &bytes[direct..];
                if !rest.is_empty() {
                    let padded = rest.len().div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
                    STAGING.with_borrow_mut(|staging| {
                        let buf = staging.get(padded);
                        buf[..rest.len()].copy_from_slice(rest);
                        buf[rest.len()..].fill(0);
                        write_pieces(&mut file, buf)
                    })?;
                }
                // The padding goes: the object is exactly its bytes.
                file.set_len(bytes.len() as u64)?;
                return Ok(file);
            }
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                // Some file systems create the file before refusing the flag.
                let _ = fs::remove_file(path);
            }
            Err(err) => return Err(err),
        }
    }
    let mut file = File::create_new(path)?;
    file.write_all(bytes)?;
    Ok(file)
}
