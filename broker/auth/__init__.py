"""Users and permissions (``[[auth.users]]``), with nats-server's authorization
semantics, for both listeners: who a connection is (:class:`Authenticator`,
:class:`Identity`) and what it may publish and subscribe to
(:class:`Permissions`). The configuration's shape is :mod:`._config`'s.

Imports only ``protocol`` and ``storage`` (for durations): the configuration
loader uses it, and both sessions do.
"""

from ._config import AuthConfig as AuthConfig
from ._config import AuthConfigError as AuthConfigError
from ._config import PermissionsConfig as PermissionsConfig
from ._config import ResponsePermission as ResponsePermission
from ._config import SubjectPermission as SubjectPermission
from ._config import UserConfig as UserConfig
from ._config import parse_auth as parse_auth
from ._permissions import Permissions as Permissions
from ._users import Authenticator as Authenticator
from ._users import Identity as Identity
from ._users import new_nonce as new_nonce

__all__ = [name for name in dir() if not name.startswith("_")]
