"""`RuntimeSettings.from_environment`: the settings a load serves by, read once from the
environment, checked and typed; the keywords a load is given win over the variables, and
leave them unread."""

from __future__ import annotations

from pathlib import Path

import pytest

from cutecc.archs import NO_DRIVER
from cutecc.errors import CuteccError
from cutecc.runtime.runtime_settings import RuntimeSettings


def test_nothing_set_is_the_defaults() -> None:
    rs = RuntimeSettings.from_environment({})
    assert rs == RuntimeSettings() and not rs.given("strict")
    assert rs.where("strict") == "$CUTECC_STRICT" and rs.where("jit") == "$CUTECC_JIT"


def test_each_variable_is_read_typed_and_names_where_it_came_from() -> None:
    rs = RuntimeSettings.from_environment({
        "CUTECC_ARCH": "sm_90a", "CUTECC_DRIVER_VERSION": "12080", "CUTECC_STRICT": "yes",
        "CUTECC_JIT": "1", "CUTECC_READ_ONLY": "on", "CUTECC_SYNC_CHECK": "true",
        "CUTECC_TRUSTED_KEYS": "/k/a.pub::/k/b.pub", "CUTECC_ALLOW_UNSIGNED": "1",
        "CUTECC_DEVICE_KIND": "NVIDIA H100 80GB HBM3", "CUTECC_TVM_FFI_TORCH": "1"})
    assert (rs.arch, rs.driver_version, rs.device_kind) == ("sm_90a", (12, 8), "NVIDIA H100 80GB HBM3")
    assert rs.strict and rs.jit and rs.read_only and rs.sync_check
    assert rs.allow_unsigned and rs.tvm_ffi_interop
    assert rs.trusted_keys == (Path("/k/a.pub"), Path("/k/b.pub"))
    assert rs.where("strict") == "$CUTECC_STRICT" and rs.where("trusted_keys") == "$CUTECC_TRUSTED_KEYS"
    off = RuntimeSettings.from_environment({"CUTECC_STRICT": "off", "CUTECC_JIT": "0",
                                            "CUTECC_DRIVER_VERSION": "none", "CUTECC_TVM_FFI_TORCH": "yes"})
    assert not (off.strict or off.jit or off.tvm_ffi_interop) and off.driver_version == NO_DRIVER


@pytest.mark.parametrize(("name", "value"), [("CUTECC_ARCH", "hopper"),
                                             ("CUTECC_DRIVER_VERSION", "thirteen")])
def test_a_bad_value_is_an_error_naming_its_variable(name: str, value: str) -> None:
    with pytest.raises(CuteccError) as e:
        RuntimeSettings.from_environment({name: value})
    assert e.value.where == f"${name}" and e.value.exit_code == 2


def test_the_keywords_given_win_and_leave_their_variables_unread() -> None:
    env = {"CUTECC_ARCH": "hopper", "CUTECC_JIT": "1", "CUTECC_TRUSTED_KEYS": "/k/env.pub"}
    rs = RuntimeSettings.from_environment(env, arch="sm_80", jit=False, strict=True,
                                          trusted_keys=["/k/given.pub"], allow_unsigned=True)
    assert rs.arch == "sm_80" and rs.where("arch") == "cutecc.load arch"  # the bad variable unread
    assert not rs.jit and rs.strict and rs.where("strict") == "load(strict=True)"
    assert rs.trusted_keys == (Path("/k/given.pub"),) and rs.where("trusted_keys") == "trusted_keys="
    assert rs.allow_unsigned and rs.where("allow_unsigned") == "allow_unsigned=True"
    assert RuntimeSettings.from_environment(env, arch="sm_80", jit=True).where("jit") == "jit=True"
    # not given (None, False, no keys): the variable decides
    assert RuntimeSettings.from_environment({"CUTECC_JIT": "1"}, jit=None).where("jit") == "$CUTECC_JIT"
