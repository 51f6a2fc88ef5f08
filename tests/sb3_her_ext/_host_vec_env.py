"""The SB3 ``VecEnv`` bookkeeping the tests' toy device envs share (one env object, monitored episodes)."""

from __future__ import annotations

from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import VecEnv


class ToyVecEnv(VecEnv):
    """A ``VecEnv`` whose attributes live on itself and whose episodes count as monitored (the toy device envs
    report ``episode`` infos themselves)."""

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices=None) -> list:
        if not hasattr(self, attr_name):
            raise AttributeError(attr_name)
        return [getattr(self, attr_name)] * len(self._get_indices(indices))

    def set_attr(self, attr_name: str, value, indices=None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *args, indices=None, **kwargs) -> list:
        raise AttributeError(method_name)

    def env_is_wrapped(self, wrapper_class: type, indices=None) -> list[bool]:
        return [wrapper_class is Monitor] * len(self._get_indices(indices))
