"""The Python checkpoint reader (zeroshard/_checkpoint.py) follows the C++ reader's rules
(checkpoint/manifest.cc, safetensors.cc, shard_file.cc, checkpoint_reader.cc) on checkpoints the
real C++ writer wrote (checkpoint_fixture.cc) and on corrupted copies of them: files[].path is a
plain file name, no link is followed, the fragments cover every tensor exactly once, and no
declared size is trusted (or allocated) before it is checked against the file. Where the C++
reader already has the rule, the fixture's `verify` shows that it refuses the same copy.

Each test that failed on the reader before issue 24's fix says so, and how.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import tracemalloc
import unittest
from unittest import mock

import torch

from cluster_support import runfiles_workspace
from zeroshard import _checkpoint, _safetensors

STEP_DIR = "step-000000000010"
JOB_ID = "job-000007"


def fixture_binary():
    return os.path.join(runfiles_workspace(), "python", "checkpoint_fixture")


def fixture_values(state, tensor, count):
    """checkpoint_fixture's values: k / 1024, k = (i * 7919 + len(tensor) * 131 + len(state) *
    17) % 2001 - 1000."""
    index = torch.arange(count, dtype=torch.int64)
    k = (index * 7919 + len(tensor) * 131 + len(state) * 17) % 2001 - 1000
    return (k.to(torch.float64) / 1024).to(torch.float32)


def shard_name(rank, world_size=2):
    return f"rank-{rank:05d}-of-{world_size:05d}.safetensors"


def read_shard(path):
    """(the safetensors header as a dict, the data section's bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write_shard(path, header, data, header_text=None):
    """Replaces `path` with a safetensors file of `header` (or the raw `header_text`) and
    `data`; returns its size."""
    text = header_text if header_text is not None else \
        json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    os.replace(path + ".tmp", path)
    return os.path.getsize(path)


def edit_metadata(header, key, edit):
    """Applies `edit` to the parsed protobuf JSON of __metadata__[key]."""
    value = json.loads(header["__metadata__"][key])
    edit(value)
    header["__metadata__"][key] = json.dumps(value, separators=(",", ":"))


class FullStateWriterTest(unittest.TestCase):
    """write_full_state: the arrays, then the deferred ones as produce() yields them (zero3's
    parameters, a gathered module at a time), and the tensors' storages stay resizable (zero3
    frees a parameter's storage by resizing it; numpy() would have pinned it)."""

    def setUp(self):
        self.directory = tempfile.mkdtemp()
        self.path = os.path.join(self.directory, "full_state.safetensors")

    def tearDown(self):
        shutil.rmtree(self.directory)

    def test_deferred_tensors_follow_the_arrays_in_the_order_produced(self):
        arrays = {"exp_avg/w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
        produced = []

        def produce():
            for values in ([1.5, 2.5], [7.0, 8.0, 9.0]):
                produced.append(len(values))
                yield torch.tensor(values)

        _checkpoint.write_full_state(self.path, arrays, [("param/b", 2), ("param/w", 3)], produce)
        tensors, _ = _safetensors.read_safetensors(self.path)
        self.assertEqual(list(tensors), ["exp_avg/w", "param/b", "param/w"])
        values = _safetensors.to_torch(tensors)
        self.assertTrue(torch.equal(values["exp_avg/w"], torch.arange(6, dtype=torch.float32)))
        self.assertTrue(torch.equal(values["param/b"], torch.tensor([1.5, 2.5])))
        self.assertTrue(torch.equal(values["param/w"], torch.tensor([7.0, 8.0, 9.0])))
        self.assertEqual(produced, [2, 3])
        # The storage written from can still be freed by resizing.
        arrays["exp_avg/w"].storage().resize_(0)

    def test_a_deferred_tensor_of_another_size_is_refused_naming_it(self):
        def produce():
            yield torch.zeros(4)

        with self.assertRaisesRegex(ValueError, "param/b: produce.. yielded no tensor of shape "
                                    r"\[2\]"):
            _checkpoint.write_full_state(self.path, {}, [("param/b", 2)], produce)


class CheckpointReaderTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.fixtures = tempfile.mkdtemp(prefix="fixtures-", dir=os.environ.get("TEST_TMPDIR"))
        subprocess.run([fixture_binary(), "write", cls.fixtures], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.fixtures, ignore_errors=True)

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="work-", dir=os.environ.get("TEST_TMPDIR"))
        self.addCleanup(shutil.rmtree, self.work, True)

    # ---- helpers ----

    def copy_case(self, case):
        """A writable copy of the fixture's checkpoint `case`: its step directory, inside a job
        directory of its own."""
        step_dir = os.path.join(tempfile.mkdtemp(prefix=f"{case}-", dir=self.work), STEP_DIR)
        shutil.copytree(os.path.join(self.fixtures, case, STEP_DIR), step_dir)
        for name in os.listdir(step_dir):
            os.chmod(os.path.join(step_dir, name), 0o644)
        return step_dir

    @staticmethod
    def manifest_path(step_dir):
        return os.path.join(step_dir, "manifest.json")

    def edit_manifest(self, step_dir, edit):
        path = self.manifest_path(step_dir)
        with open(path) as f:
            manifest = json.load(f)
        edit(manifest)
        with open(path, "w") as f:
            json.dump(manifest, f)

    def set_listed_bytes(self, step_dir, rank, size):
        def edit(manifest):
            for file in manifest["files"]:
                if file["rank"] == rank:
                    file["bytes"] = str(size)
        self.edit_manifest(step_dir, edit)

    def rewrite(self, step_dir, rank, edit, header_text=None):
        """Rewrites rank `rank`'s file: edit(header, data) returns the new data (or None to keep
        it); the manifest then lists the new size, so that only the edit is wrong."""
        path = os.path.join(step_dir, shard_name(rank))
        header, data = read_shard(path)
        new_data = edit(header, data) if edit is not None else None
        size = write_shard(path, header, data if new_data is None else new_data, header_text)
        self.set_listed_bytes(step_dir, rank, size)
        return path

    def cpp_verdict(self, step_dir):
        """None when the C++ reader (ReadManifest + CheckpointReader::Open) accepts `step_dir`,
        else its error."""
        run = subprocess.run([fixture_binary(), "verify", step_dir], capture_output=True,
                             text=True, timeout=60)
        if run.returncode not in (0, 1):
            raise AssertionError(f"checkpoint_fixture verify: exit {run.returncode}: "
                                 f"{run.stdout}{run.stderr}")
        return None if run.returncode == 0 else run.stdout.strip()

    def assert_refused(self, step_dir, pattern, cpp_too=True, read=None, max_peak=None):
        """read_full_state (or `read`) raises ValueError matching `pattern` without allocating a
        tensor (and, with max_peak, with at most that many bytes of Python allocations at a
        time); with cpp_too, the C++ reader refuses the same directory."""
        read = read or _checkpoint.read_full_state
        with mock.patch.object(torch, "empty", wraps=torch.empty) as empty, \
                mock.patch.object(torch, "zeros", wraps=torch.zeros) as zeros:
            tracemalloc.start()
            try:
                with self.assertRaisesRegex(ValueError, pattern) as raised:
                    read(self.manifest_path(step_dir))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        empty.assert_not_called()
        zeros.assert_not_called()
        if max_peak is not None:
            self.assertLess(peak, max_peak, f"{raised.exception}")
        if cpp_too:
            verdict = self.cpp_verdict(step_dir)
            self.assertIsNotNone(verdict, f"the C++ reader accepts what Python refused: "
                                          f"{raised.exception}")
        return str(raised.exception)

    # ---- what the real writer wrote ----

    def test_reads_every_array_the_writer_wrote(self):
        for case, states in (("good", ["param", "exp_avg", "exp_avg_sq"]), ("tiny", ["param"])):
            with self.subTest(case=case):
                step_dir = self.copy_case(case)
                self.assertIsNone(self.cpp_verdict(step_dir))
                header, full = _checkpoint.read_full_state(self.manifest_path(step_dir))
                self.assertEqual(header.job_id, JOB_ID)
                self.assertEqual(list(header.states), states)
                self.assertEqual(sorted(full), sorted(states))
                for state in states:
                    for tensor in header.tensors:
                        count = 1
                        for dim in tensor.shape:
                            count *= dim
                        got = full[state][tensor.name]
                        self.assertEqual(got.dtype, torch.float32)
                        self.assertTrue(
                            torch.equal(got, fixture_values(state, tensor.name, count)),
                            f"{case}: {state}/{tensor.name}")

    def test_read_header_and_manifest(self):
        step_dir = self.copy_case("good")
        manifest, header = _checkpoint.read_header(self.manifest_path(step_dir))
        self.assertEqual((manifest.job_id, manifest.step, manifest.world_size), (JOB_ID, 10, 2))
        self.assertEqual([t.name for t in header.tensors],
                         ["0.weight", "0.bias", "2.weight", "2.bias"])
        self.assertEqual(header.rank, 0)
        self.assertEqual(_checkpoint.read_manifest(self.manifest_path(step_dir)).step, 10)

    # ---- the job ----

    def test_a_checkpoint_of_another_job_is_refused_when_a_job_is_expected(self):
        # Failed before the fix: there was no expected_job_id (TypeError).
        step_dir = self.copy_case("tiny")
        path = self.manifest_path(step_dir)
        for read in (_checkpoint.read_manifest, _checkpoint.read_header,
                     _checkpoint.read_full_state):
            with self.subTest(read=read.__name__):
                with self.assertRaisesRegex(
                        ValueError, f'{re.escape(path)}: job_id "{JOB_ID}", but the checkpoint '
                        'of job "job-000008" was expected'):
                    read(path, expected_job_id="job-000008")
                read(path, expected_job_id=JOB_ID)
                read(path)  # the caller names this source on purpose: any job's

    def test_a_file_of_another_job_is_refused(self):
        # Failed before the fix: the headers were not compared with the manifest.
        step_dir = self.copy_case("tiny")

        def other_job(header, data):
            edit_metadata(header, "zeroshard.checkpoint",
                          lambda h: h.update(job_id="job-000008"))
        path = self.rewrite(step_dir, 1, other_job)
        self.assert_refused(step_dir, f"checkpoint file {re.escape(path)}: job_id job-000008, "
                                      f"but the manifest says {JOB_ID}")

    def test_a_superseded_checkpoint_is_refused(self):
        # Issue 27: a checkpoint retired because its job went back to an earlier step is never
        # read, even where its manifest is copied to a step directory's name.
        step_dir = self.copy_case("tiny")
        self.edit_manifest(step_dir, lambda m: m.update(superseded={
            "loadedStep": "4", "generation": "1", "reason": "the trainers loaded step 4"}))
        message = self.assert_refused(
            step_dir, "was superseded: job job-000007 went back to step 4 in generation 1 "
                      r"\(the trainers loaded step 4\)", read=_checkpoint.read_header)
        self.assertIn("was superseded", self.cpp_verdict(step_dir), message)
        # The manifest itself still reads (a listing shows what was retired).
        self.assertEqual(_checkpoint.read_manifest(self.manifest_path(step_dir))
                         .superseded.loaded_step, 4)

    # ---- files[].path and links ----

    def test_a_path_that_leaves_the_step_directory_is_refused(self):
        # Failed before the fix: "../x" was joined to the step directory and read (here a valid
        # copy of rank 1's file, planted next to the step directory).
        step_dir = self.copy_case("tiny")
        shutil.copy(os.path.join(step_dir, shard_name(1)), os.path.join(step_dir, "..", "x"))
        self.edit_manifest(step_dir, lambda m: m["files"][1].update(path="../x"))
        self.assert_refused(step_dir, r'manifest: .*manifest\.json: files\[1\]\.path: '
                                      r'"\.\./x" is not a file name')

    def test_every_name_that_is_not_a_plain_file_name_is_refused(self):
        # Failed before the fix: none of them was checked.
        for bad in ["", ".", "..", "sub/x", "/etc/passwd", "a\\b", "a\0b"]:
            with self.subTest(path=bad):
                step_dir = self.copy_case("tiny")
                self.edit_manifest(step_dir, lambda m: m["files"][1].update(path=bad))
                # The C++ reader takes "a\\b" for a file name (here a missing one).
                message = self.assert_refused(step_dir, r"files\[1\]\.path: .* is not a file "
                                                        "name", cpp_too=bad != "a\\b")
                self.assertNotIn("\0", message)

    def test_a_shard_file_that_is_a_symlink_is_refused(self):
        # Failed before the fix: the link was followed and its target read as rank 1's file.
        step_dir = self.copy_case("tiny")
        outside = os.path.join(self.work, "outside")
        os.mkdir(outside)
        link = os.path.join(step_dir, shard_name(1))
        shutil.move(link, os.path.join(outside, "target.safetensors"))
        os.symlink(os.path.join(outside, "target.safetensors"), link)
        before = os.listdir(outside)
        for read in (_checkpoint.read_full_state,
                     lambda p: _checkpoint._Checkpoint(p, None).close()):
            self.assert_refused(step_dir, f"files\\[1\\].path: {re.escape(link)} is a symbolic "
                                          "link, where a regular file is expected: refused "
                                          "\\(checkpoint storage never follows links\\)",
                                read=read)
        self.assertEqual(os.listdir(outside), before)

    def test_a_manifest_or_step_directory_that_is_a_symlink_is_refused(self):
        # Failed before the fix: both links were followed.
        step_dir = self.copy_case("tiny")
        real = os.path.join(self.work, "real-manifest.json")
        shutil.move(self.manifest_path(step_dir), real)
        os.symlink(real, self.manifest_path(step_dir))
        for read in (_checkpoint.read_manifest, _checkpoint.read_header,
                     _checkpoint.read_full_state):
            self.assert_refused(step_dir, f"manifest: {re.escape(self.manifest_path(step_dir))} "
                                          "is a symbolic link, where a regular file is expected",
                                read=read)

        linked_job = os.path.join(self.work, "linked-job")
        os.mkdir(linked_job)
        linked_step = os.path.join(linked_job, STEP_DIR)
        os.symlink(self.copy_case("good"), linked_step)
        self.assert_refused(linked_step, f"{re.escape(linked_step)} is a symbolic link, where a "
                                         "directory is expected: refused \\(checkpoint storage "
                                         "never follows links\\)")

    def test_a_fifo_in_place_of_a_file_is_refused_without_blocking(self):
        # Before the fix: refused as "does not exist" (os.path.isfile); now named for what it is.
        step_dir = self.copy_case("tiny")
        fifo = os.path.join(step_dir, shard_name(1))
        os.unlink(fifo)
        os.mkfifo(fifo)
        self.assert_refused(step_dir, f"files\\[1\\].path: {re.escape(fifo)} is a FIFO, where "
                                      "a regular file is expected: refused")

    def test_a_missing_manifest_says_so(self):
        # Passed before the fix too: the wording load_state_dict documents.
        path = os.path.join(self.work, "job", STEP_DIR, "manifest.json")
        with self.assertRaisesRegex(ValueError, f"manifest: {re.escape(path)} does not exist"):
            _checkpoint.read_full_state(path)
        os.makedirs(os.path.dirname(path))
        with self.assertRaisesRegex(ValueError, f"manifest: {re.escape(path)} does not exist"):
            _checkpoint.read_header(path)

    # ---- coverage ----

    def test_a_gap_is_refused_naming_the_tensor_and_the_elements(self):
        # Failed before the fix: refused, but as "param/w is not covered by its files", without
        # saying which elements are missing.
        step_dir = self.copy_case("gap")
        self.assert_refused(step_dir, f'checkpoint {re.escape(step_dir)}: no fragment holds '
                                      r'elements \[16, 20\) of state "param" of tensor "w"')

    def test_a_gap_made_up_for_by_an_overlap_is_refused(self):
        # Failed before the fix: the lengths summed up to w's 32 elements, so elements [16, 20)
        # came back as zeros, without an error.
        step_dir = self.copy_case("gap_and_overlap")
        rank1 = os.path.join(step_dir, shard_name(1))
        self.assert_refused(step_dir, f'fragment "param/w/8-16" of {re.escape(rank1)} overlaps '
                                      f'fragment "param/w/0-16" of .*{re.escape(shard_name(0))}')

    def test_an_overlap_is_refused(self):
        # Failed before the fix: overlaps were allowed (the later file's values won).
        step_dir = self.copy_case("overlap")
        rank1 = os.path.join(step_dir, shard_name(1))
        self.assert_refused(step_dir, f'fragment "param/w/12-32" of {re.escape(rank1)} overlaps '
                                      'fragment "param/w/0-16" of')

    def test_a_fragment_beyond_its_tensor_is_refused(self):
        # Failed before the fix: a RuntimeError from torch's slice assignment, not a ValueError
        # naming the fragment.
        step_dir = self.copy_case("tiny")

        def beyond(header, data):
            entry = header.pop("param/w/16-32")
            entry["shape"] = [20]
            entry["data_offsets"] = [0, 80]
            header["param/w/16-36"] = entry
            edit_metadata(header, "zeroshard.fragments",
                          lambda t: t["fragments"][0].update(end="36"))
            return data + b"\0" * 16
        path = self.rewrite(step_dir, 1, beyond)
        self.assert_refused(step_dir, f'checkpoint file {re.escape(path)}: fragments\\[0\\] '
                                      '"param/w/16-36": elements \\[16, 36\\) are not a '
                                      'non-empty part of \\[0, 32\\)')

    # ---- declared sizes ----

    def test_a_header_claiming_a_terabyte_in_a_small_file_is_refused_unallocated(self):
        # Failed before the fix: read_full_state sized torch.zeros from the header (1 TB) and
        # read_header trusted it; now nothing is allocated (no torch.empty/zeros call, under
        # 256 KiB of Python allocations) and the message names the tensor.
        terabyte_elements = 250_000_000_000  # 1e12 bytes of F32

        def terabyte(header, data):
            entry = header.pop("param/w/0-16")
            entry["shape"] = [terabyte_elements]
            entry["data_offsets"] = [0, 4 * terabyte_elements]
            header[f"param/w/0-{terabyte_elements}"] = entry
            edit_metadata(header, "zeroshard.fragments",
                          lambda t: t["fragments"][0].update(end=str(terabyte_elements)))
            edit_metadata(header, "zeroshard.checkpoint",
                          lambda h: h["tensors"][0].update(shape=[str(terabyte_elements)]))
        step_dir = self.copy_case("tiny")
        path = self.rewrite(step_dir, 0, terabyte)
        self.assertLess(os.path.getsize(path), 1024)
        for read in (_checkpoint.read_full_state, _checkpoint.read_header):
            with self.subTest(read=read.__name__):
                self.assert_refused(
                    step_dir, f'safetensors file {re.escape(path)}: tensor "param/w/0-'
                    f'{terabyte_elements}" \\(data_offsets \\[0, 1000000000000\\]\\) ends '
                    'beyond the data section, which holds 80 bytes', read=read,
                    max_peak=256 << 10)

    def test_a_header_length_beyond_the_file_is_refused_unread(self):
        # Failed before the fix: a 50 MB header length (under the cap) in a small file made it
        # read (and allocate) 50 MB, then fail as "not JSON".
        step_dir = self.copy_case("tiny")
        path = os.path.join(step_dir, shard_name(1))
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(struct.pack("<Q", 50_000_000))
        self.assert_refused(step_dir, f"safetensors file {re.escape(path)}: the header length "
                                      f"50000000 reaches beyond the file \\({size} bytes\\)",
                            max_peak=256 << 10)

    def test_a_header_length_over_the_format_limit_is_refused(self):
        # Refused before the fix too (the same 100,000,000-byte cap as the C++ reader's
        # kMaxSafetensorsHeaderBytes), as "not a safetensors file (header of 150000000 bytes)";
        # now in the C++ reader's words. The file is sparse.
        step_dir = self.copy_case("tiny")
        path = os.path.join(step_dir, shard_name(1))
        with open(path, "r+b") as f:
            f.write(struct.pack("<Q", 150_000_000))
            f.truncate(200_000_000)
        self.set_listed_bytes(step_dir, 1, 200_000_000)
        self.assert_refused(step_dir, "the header length 150000000 exceeds the format's limit "
                                      "of 100000000")

    def test_declared_shapes_and_offsets_are_checked_against_each_other(self):
        # Failed before the fix: each of these passed (shape, dtype and the other tensors were
        # never looked at), except the last, refused with another message.
        def set_entry(key, **fields):
            def edit(header, data):
                header[key].update(fields)
            return edit

        cases = [
            ("negative dimension", set_entry("param/w/16-32", shape=[-16]),
             r'shape\[0\]: -16 is not a non-negative 64-bit integer'),
            ("shape overflow", set_entry("param/w/16-32", shape=[1 << 40, 1 << 40]),
             "shape overflows 64 bits"),
            ("offsets that end before they begin",
             set_entry("param/w/16-32", data_offsets=[64, 0]), "end before they begin"),
            ("length other than numel * itemsize", set_entry("param/w/16-32", dtype="F64"),
             r"dtype F64 x shape \[16\] is 128 bytes, but data_offsets \[0, 64\] hold 64"),
            ("unknown field", set_entry("param/w/16-32", extra=1), 'unknown field "extra"'),
            ("offset past a gap",
             lambda h, d: (h["param/w/16-32"].update(data_offsets=[8, 72]), d + b"\0" * 8)[1],
             "leaves a gap of 8 bytes before it"),
            ("bytes left over", lambda h, d: d + b"\0" * 8,
             "the tensors cover 64 bytes of data, but the file holds 72 after its header"),
            ("stored as another dtype",
             lambda h, d: h["param/w/16-32"].update(dtype="I32"),
             r'fragment "param/w/16-32" \(FLOAT32, 16 elements\) is stored as I32 \[16\]'),
        ]
        for name, edit, pattern in cases:
            with self.subTest(case=name):
                step_dir = self.copy_case("tiny")
                self.rewrite(step_dir, 1, edit)
                self.assert_refused(step_dir, pattern)

    def test_a_header_with_a_duplicate_name_is_refused(self):
        # Failed before the fix: json.loads kept the last of the two entries.
        step_dir = self.copy_case("tiny")
        header, _ = read_shard(os.path.join(step_dir, shard_name(1)))
        text = json.dumps(header, separators=(",", ":"))
        entry = json.dumps(header["param/w/16-32"], separators=(",", ":"))
        text = text[:-1] + ',"param/w/16-32":' + entry + "}"
        self.rewrite(step_dir, 1, None, header_text=text.encode())
        self.assert_refused(step_dir, 'header: duplicate name "param/w/16-32"')

    # ---- manifest.json's size ----

    def test_a_manifest_larger_than_the_cap_is_refused_unread(self):
        # Failed before the fix: the whole file was read (here 1 GiB of a sparse file's zeros)
        # and then refused as not JSON.
        step_dir = self.copy_case("tiny")
        path = self.manifest_path(step_dir)
        with open(path, "r+b") as f:
            f.truncate(1 << 30)
        for read in (_checkpoint.read_manifest, _checkpoint.read_full_state):
            self.assert_refused(step_dir, f"manifest: {re.escape(path)} holds 1073741824 bytes, "
                                          "more than the 16777216 this reader accepts",
                                read=read, max_peak=256 << 10)

    def test_a_manifest_of_exactly_the_cap_is_read(self):
        # The boundary (JSON may end in whitespace). Before the fix, the 16 MiB one was read
        # too, and so was the one a byte longer (and any size).
        step_dir = self.copy_case("tiny")
        path = self.manifest_path(step_dir)
        with open(path, "rb") as f:
            text = f.read()
        with open(path, "wb") as f:
            f.write(text + b" " * ((16 << 20) - len(text)))
        self.assertEqual(os.path.getsize(path), 16 << 20)
        self.assertEqual(_checkpoint.read_manifest(path).job_id, JOB_ID)
        with open(path, "ab") as f:
            f.write(b" ")
        self.assert_refused(step_dir, "holds 16777217 bytes, more than the 16777216 this "
                                      "reader accepts",
                            read=_checkpoint.read_manifest)


if __name__ == "__main__":
    unittest.main()
