"""Test factories and comparisons shared by every test folder."""

from tests.utils.assert_close import assert_rel_close, rel_err
from tests.utils.device import TEST_DEVICE
from tests.utils.inputs import make_grouped_inputs, make_inputs, make_state

__all__ = ["TEST_DEVICE", "assert_rel_close", "make_grouped_inputs", "make_inputs", "make_state", "rel_err"]
