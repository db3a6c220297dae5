"""macOS: ``NSProcessInfo.processInfo.thermalState`` through the Objective-C runtime, with ctypes only (no pyobjc)."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

from .providers import ThermalProvider
from .state import ThermalState

FOUNDATION_PATH = "/System/Library/Frameworks/Foundation.framework/Foundation"
# NSProcessInfoThermalState raw values (Foundation, macOS 10.10.3+)
_STATES = {0: ThermalState.NOMINAL, 1: ThermalState.FAIR, 2: ThermalState.SERIOUS, 3: ThermalState.CRITICAL}


def _bind(function, restype, *argtypes) -> Callable:
    """``function``'s address called through the exact C prototype ``restype (*)(argtypes...)``."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


class ObjcRuntime:
    """The few Objective-C runtime calls the provider needs, each bound with its own prototype.

    ``objc_msgSend`` is not a variadic function: it jumps straight into the method's implementation, so every
    call must go through a pointer typed like that method (``id self, SEL _cmd, args...``). Calling it with
    ctypes' default prototype breaks on arm64, where variadic and fixed arguments are passed differently.
    """

    def __init__(self, libobjc):
        self._get_class = _bind(libobjc.objc_getClass, ctypes.c_void_p, ctypes.c_char_p)
        self._register = _bind(libobjc.sel_registerName, ctypes.c_void_p, ctypes.c_char_p)
        send = libobjc.objc_msgSend
        self._send_id = _bind(send, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)  # id (id, SEL)
        self._send_long = _bind(send, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)  # NSInteger (id, SEL)
        self._send_bool_sel = _bind(send, ctypes.c_bool, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)

    def get_class(self, name: bytes) -> int | None:
        return self._get_class(name)

    def selector(self, name: bytes) -> int:
        return self._register(name)

    def send_id(self, receiver: int, selector: int) -> int | None:
        return self._send_id(receiver, selector)

    def send_long(self, receiver: int, selector: int) -> int:
        return self._send_long(receiver, selector)

    def responds_to(self, receiver: int, selector: int) -> bool:
        """``[receiver respondsToSelector:selector]``."""
        return bool(self._send_bool_sel(receiver, self.selector(b"respondsToSelector:"), selector))


def load_objc_runtime() -> ObjcRuntime:
    """libobjc with Foundation loaded (NSProcessInfo lives there). Raises OSError off macOS."""
    path = ctypes.util.find_library("objc")
    if path is None:
        raise OSError("libobjc was not found")
    libobjc = ctypes.CDLL(path)
    ctypes.CDLL(ctypes.util.find_library("Foundation") or FOUNDATION_PATH)
    return ObjcRuntime(libobjc)


class MacThermalProvider(ThermalProvider):
    """Reads ``[[NSProcessInfo processInfo] thermalState]``: nominal, fair, serious or critical."""

    name = "macos"

    def __init__(self, runtime_loader: Callable[[], ObjcRuntime] = load_objc_runtime):
        self._runtime = self._process_info = self._thermal_state = None
        try:
            self._bind(runtime_loader())
        except OSError as e:
            self.reason = f"NSProcessInfo.thermalState is not available: {e}"

    def _bind(self, runtime: ObjcRuntime) -> None:
        cls = runtime.get_class(b"NSProcessInfo")
        if not cls:
            raise OSError("the NSProcessInfo class is not registered")
        info = runtime.send_id(cls, runtime.selector(b"processInfo"))
        selector = runtime.selector(b"thermalState")
        if not info or not runtime.responds_to(info, selector):
            raise OSError("this macOS has no thermalState (it needs 10.10.3 or later)")
        self._runtime, self._process_info, self._thermal_state = runtime, info, selector

    def read(self) -> ThermalState:
        if self._runtime is None:
            return ThermalState.UNKNOWN
        return _STATES.get(self._runtime.send_long(self._process_info, self._thermal_state), ThermalState.UNKNOWN)
