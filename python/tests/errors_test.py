"""Tests of zeroshard.Error: codes, field paths parsed from server messages, conversion of
grpc.RpcError, and its text."""

import pickle
import unittest

import grpc

import zeroshard
from zeroshard.errors import field_of


class FakeRpcError(grpc.RpcError, grpc.Call):
    """What a stub raises: an RpcError that is also a grpc.Call (code and details)."""

    def __init__(self, code, details):
        self._code = code
        self._details = details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def initial_metadata(self):
        return ()

    def trailing_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


class FieldOfTest(unittest.TestCase):
    def test_leading_paths_of_invalid_argument_messages(self):
        cases = {
            "spec.optimizer.lr: -1 is out of range (0, 1000]": "spec.optimizer.lr",
            "spec.workload.preset: unknown preset 'huge'; known: seed": "spec.workload.preset",
            "spec.workload.layer_sizes[2]: 0 is out of range [1, 1048576]": (
                "spec.workload.layer_sizes[2]"
            ),
            "spec.param_groups[1].patterns: 0 patterns": "spec.param_groups[1].patterns",
            "spec.workload: set either preset or layer_sizes, not both": "spec.workload",
            "rank: 3 is out of range [0, 2)": "rank",
        }
        for message, field in cases.items():
            with self.subTest(message=message):
                self.assertEqual(field_of(grpc.StatusCode.INVALID_ARGUMENT, message), field)
                self.assertEqual(
                    zeroshard.Error(grpc.StatusCode.INVALID_ARGUMENT, message).field, field
                )

    def test_messages_without_a_leading_path(self):
        for message in ["", "bad request", "two words: are not a path", "spec.: empty part",
                        "spec.lr -1 has no colon", "spec[x]: not an index"]:
            with self.subTest(message=message):
                self.assertIsNone(field_of(grpc.StatusCode.INVALID_ARGUMENT, message))

    def test_other_codes_name_no_field(self):
        for code in [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
                     grpc.StatusCode.UNAVAILABLE]:
            with self.subTest(code=code):
                self.assertIsNone(zeroshard.Error(code, "job_id: no job job-000009").field)

    def test_explicit_field_wins(self):
        error = zeroshard.Error(grpc.StatusCode.INVALID_ARGUMENT, "not a path", field="spec.name")
        self.assertEqual(error.field, "spec.name")


class ErrorTest(unittest.TestCase):
    def test_from_rpc_error_keeps_code_and_details(self):
        error = zeroshard.Error.from_rpc_error(
            FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "spec.steps: 0 is out of range")
        )
        self.assertIs(error.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(error.message, "spec.steps: 0 is out of range")
        self.assertEqual(error.field, "spec.steps")

    def test_from_rpc_error_without_a_call(self):
        error = zeroshard.Error.from_rpc_error(grpc.RpcError("channel closed"))
        self.assertIs(error.code, grpc.StatusCode.UNKNOWN)
        self.assertIn("channel closed", error.message)
        self.assertIsNone(error.field)

    def test_str_names_code_and_message(self):
        error = zeroshard.Error(grpc.StatusCode.NOT_FOUND, "job_id: no job job-000404")
        self.assertEqual(str(error), "NOT_FOUND: job_id: no job job-000404")
        self.assertIn("NOT_FOUND", repr(error))

    def test_is_an_exception_that_pickles(self):
        error = zeroshard.Error(grpc.StatusCode.INVALID_ARGUMENT, "spec.name: required")
        self.assertIsInstance(error, Exception)
        copy = pickle.loads(pickle.dumps(error))
        self.assertEqual((copy.code, copy.message, copy.field),
                         (error.code, error.message, error.field))


if __name__ == "__main__":
    unittest.main()
