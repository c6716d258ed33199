"""Secrets and the network: what the host has must not be reachable from the box."""

from __future__ import annotations

import socket
import threading

import pytest

pytestmark = pytest.mark.docker
SECRETS = {
    "OPENAI_API_KEY": "sk-attack-openai-1f2e3d4c5b6a",
    "GITHUB_TOKEN": "ghp_attackgithubtoken0123456789",
    "OA_GRANT_TOKEN": "grant-attack-99887766",
}


@pytest.fixture
def secret_victim(victim_factory, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return victim_factory()


def _leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def test_env_shows_no_host_secret(secret_victim):
    """`env` and `set` in the sandbox show none of the host's keys, tokens or grants."""
    out = secret_victim.sh("env; set").output
    assert not _leaks(out) and "OPENAI_API_KEY" not in out and "GITHUB_TOKEN" not in out
    secret_victim.assert_intact()


def test_proc_1_environ_is_unreadable_and_clean(secret_victim):
    """The agent's own environment (/proc/1/environ) cannot be read by commands under runc (gVisor does
    not apply the dumpable check there), and holds no secret under either."""
    out = secret_victim.sh("cat /proc/1/environ 2>&1; echo; tr '\\0' '\\n' < /proc/1/environ 2>&1").output
    assert ("Permission denied" in out or secret_victim.gvisor) and not _leaks(out)
    assert {line.split("=", 1)[0] for line in out.splitlines() if "=" in line and "\0" not in line} <= {
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "HOSTNAME",
    }
    attrs_env = secret_victim.box.container.attrs["Config"]["Env"]
    assert not _leaks("\n".join(attrs_env))
    assert {e.split("=", 1)[0] for e in attrs_env} <= {"PATH", "HOME", "LANG", "TERM"}
    secret_victim.assert_intact()


def test_proc_self_environ_is_clean(secret_victim):
    """A command's own /proc/self/environ holds no secret."""
    out = secret_victim.sh("tr '\\0' '\\n' < /proc/self/environ").output
    assert "PATH=" in out and not _leaks(out)
    secret_victim.assert_intact()


def test_only_loopback_interface(victim):
    """The container has no network interface but `lo`, and no route anywhere."""
    # gVisor has no /sys/class/net; /proc/net/dev lists the interfaces under both runtimes.
    out = victim.sh(
        "ls /sys/class/net 2>/dev/null; echo ---; tail -n +2 "
        "/proc/net/route; echo ---; tail -n +3 /proc/net/dev | cut -d: -f1"
    ).output
    interfaces, routes, dev = out.split("---")
    assert (
        interfaces.split() in (["lo"], [] if victim.gvisor else ["lo"])
        and routes.strip() == ""
        and dev.split() == ["lo"]
    )
    victim.assert_intact()


def test_host_loopback_server_is_unreachable(victim):
    """A server the test starts on the host's 127.0.0.1 cannot be reached from the box."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted = []

    def accept():
        listener.settimeout(8)
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = f"import socket\ns = socket.socket(); s.settimeout(3)\nprint(s.connect_ex(('127.0.0.1', {port})))\n"
    out = victim.sh(f'python3 -c "{code}"').output.strip()
    thread.join()
    listener.close()
    assert out == "111" and not accepted  # ECONNREFUSED: the box's loopback is its own
    victim.assert_intact()


def test_dns_has_no_route(victim):
    """No name server can be reached: a UDP connect (which sends nothing) to the configured resolver has no route."""
    code = (
        "import socket\n"
        "ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')] or ['127.0.0.53']\n"
        "for ip in ns:\n"
        "    s = socket.socket(socket.AF_INET6 if ':' in ip else socket.AF_INET, socket.SOCK_DGRAM)\n"
        "    try:\n"
        "        s.connect((ip, 53)); print('connected', ip)\n"
        "    except OSError as e:\n"
        "        print('refused', ip, e.errno)\n"
    )
    out = victim.sh(f'python3 -c "{code}"').output
    lines = out.strip().splitlines()
    assert lines and all(line.startswith("refused") or line.split()[1].startswith("127.") for line in lines), out
    victim.assert_intact()


def test_docker_socket_is_not_reachable(victim):
    """The Docker socket is neither mounted nor reachable: no way to start a sibling container."""
    out = victim.sh("ls -la /var/run/docker.sock /run/docker.sock 2>&1; grep -c docker /proc/mounts").output
    assert out.count("No such file or directory") == 2 and out.strip().endswith("0")
    victim.assert_intact()
