"""A stand-in object store for the tests: `fakestore://bucket/key` URIs whose objects are files
under a local root, with the semantics of Beam's GCS, S3 and Azure file systems that evalbeam's
output folder depends on and a local disk does not have:

- there are no folders: a path exists only when an object has exactly that name, and a "folder"
  is the objects whose names start with its prefix (mkdirs does nothing);
- delete of a path ending in "/" removes every object under that prefix; delete of any other
  path removes the object of that name, and nothing when there is none (as GCS's match-then-
  delete does);
- objects are listed recursively by prefix, whatever follows it.

Registered with Beam's FileSystems by being imported (Beam finds FileSystem subclasses by
scheme). Only the process that imported it knows the scheme, so runs that use it run the
in-process DirectRunner. Point it at a folder with `use(root)`.
"""

from __future__ import annotations

import os
import shutil

from apache_beam.io.filesystem import BeamIOError, CompressedFile, CompressionTypes, FileMetadata, FileSystem

SCHEME = "fakestore"
PREFIX = SCHEME + "://"
_ROOT = {"path": None}


def use(root) -> None:
    """Keep the store's objects under root (a local folder) from now on."""
    _ROOT["path"] = None if root is None else str(root)


def objects(uri_prefix: str = PREFIX) -> dict:
    """{uri: bytes} of every object whose name starts with uri_prefix."""
    store = FakeObjectStore(None)
    found = {}
    for m in store._list(uri_prefix):
        with open(store._local(m.path), "rb") as f:
            found[m.path] = f.read()
    return found


class FakeObjectStore(FileSystem):

    @classmethod
    def scheme(cls):
        return SCHEME

    # ---- names ----

    def _local(self, uri: str) -> str:
        if not uri.startswith(PREFIX):
            raise ValueError(f"not a {SCHEME} URI: {uri!r}")
        if _ROOT["path"] is None:
            raise RuntimeError("object_store.use(root) was not called")
        return os.path.join(_ROOT["path"], uri[len(PREFIX):])

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/")] + [p.strip("/") for p in paths])

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def has_dirs(self):
        return False

    def mkdirs(self, path):
        pass

    # ---- listing ----

    def _list(self, dir_or_prefix):
        root = _ROOT["path"]
        if root is None or not os.path.isdir(root):
            return
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                local = os.path.join(dirpath, name)
                uri = PREFIX + os.path.relpath(local, root).replace(os.sep, "/")
                if uri.startswith(dir_or_prefix):
                    yield FileMetadata(uri, os.path.getsize(local), os.path.getmtime(local))

    def exists(self, path):
        return os.path.isfile(self._local(path))

    def size(self, path):
        return os.path.getsize(self._local(path))

    def last_updated(self, path):
        return os.path.getmtime(self._local(path))

    def checksum(self, path):
        return str(self.size(path))

    def metadata(self, path):
        local = self._local(path)
        try:
            return FileMetadata(path, os.path.getsize(local), os.path.getmtime(local))
        except OSError as error:
            raise BeamIOError("Metadata operation failed", {path: error})

    # ---- objects ----

    def _open(self, path, mode, compression_type):
        compression_type = FileSystem._get_compression_type(path, compression_type)
        raw = open(self._local(path), mode)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return raw
        return CompressedFile(raw, compression_type=compression_type)

    def create(self, path, mime_type="application/octet-stream",
               compression_type=CompressionTypes.AUTO):
        os.makedirs(os.path.dirname(self._local(path)), exist_ok=True)
        return self._open(path, "wb", compression_type)

    def open(self, path, mime_type="application/octet-stream",
             compression_type=CompressionTypes.AUTO):
        return self._open(path, "rb", compression_type)

    def copy(self, source_file_names, destination_file_names):
        for source, destination in zip(source_file_names, destination_file_names):
            os.makedirs(os.path.dirname(self._local(destination)), exist_ok=True)
            shutil.copyfile(self._local(source), self._local(destination))

    def rename(self, source_file_names, destination_file_names):
        self.copy(source_file_names, destination_file_names)
        self.delete(source_file_names)

    def delete(self, paths):
        for path in paths:
            if path.endswith("/"):
                doomed = [m.path for m in self._list(path)]
            else:
                doomed = [path] if self.exists(path) else []
            for uri in doomed:
                os.remove(self._local(uri))
        self._prune()

    def _prune(self) -> None:
        """Remove the local folders no object is left in: an object store has no empty folders."""
        root = _ROOT["path"]
        for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
            if dirpath != root and not os.listdir(dirpath):
                os.rmdir(dirpath)

    def report_lineage(self, path, lineage):
        pass
