"""Build the Dockerfile's two images for amd64 and arm64 with buildah, no Docker engine and no
registry, check each as a cluster would run it, and write what was built
(``python3 deploy/build_images.py``, ``make images``).

The Dockerfile's one base is Debian bookworm (``debian:bookworm-slim``). Where no registry is
reachable, this bootstraps that base from the Debian archive with mmdebstrap (``minbase``, the
documentation and locales left out and apt's caches cleaned as the official slim image does)
for each architecture, arm64 through qemu-user-static, and lists the two as one local multi-arch image;
``--debian IMAGE`` names a pullable base instead. Each image is then built for each
architecture and checked there, by its own entrypoint:

- runtime: the entrypoint with the init container's argument (the webhook's
  ``BUNDLE_MOUNT``) as the pod's user, into an empty folder; the folder must then hold the
  runtime package and the dist-info that registers the vLLM plugin, and nothing compiled;
- operator: ``kopf --version`` and the operator's handlers imported, as uid 65532, with no
  compiler on the path.

Needs root (buildah's chroot isolation; crun refuses hybrid cgroups in some VMs), buildah,
mmdebstrap and, on an amd64 host, qemu-user-static for arm64: ``apt-get install buildah
mmdebstrap qemu-user-static``. ``--ca-bundle FILE`` gives the builds' pip a CA bundle, for a
proxy that intercepts TLS; it is mounted for the build's steps, never written into an image."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "STORAGE_DRIVER": "vfs"}  # buildah's storage: vfs works in any container
# The tag both images get: the chart's appVersion, the tag it pulls by default.
VERSION = re.search(r"^appVersion:\s*\"?([^\"\s]+)", (ROOT / "deploy/helm/flashrt/Chart.yaml").read_text(), re.M)[1]
ARCHES = ("amd64", "arm64")
LOCAL_DEBIAN = "localhost/debian:bookworm-slim"
# What debuerreotype's slimify leaves out of the official slim images (copyright files kept).
SLIM = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
)
# The apt settings debuerreotype gives the official images (its minimizing config): without
# docker-clean, every package an image's build installs stays in /var/cache/apt (89 MB in the
# operator image's).
_CLEAN = '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true";'
APT_CONFIG = {
    "docker-clean": f"DPkg::Post-Invoke {{ {_CLEAN} }};\nAPT::Update::Post-Invoke {{ {_CLEAN} }};\n"
    'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n',
    "docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
    "docker-no-languages": 'Acquire::Languages "none";\n',
    "docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
}
MERGED_USR_HOOK = "/usr/share/mmdebstrap/hooks/merged-usr"
BUNDLE_MOUNT = "/opt/flashrt"  # the init container's argument (flashrt.operator.constants)
POD_USER = "65532:65532"
COMPILERS = ("gcc", "cc", "c++", "clang", "make")


# Each architecture as uname names the host's, and the binfmt_misc entry qemu-user-static
# registers to run its binaries elsewhere.
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
BINFMT = {"amd64": "qemu-x86_64", "arm64": "qemu-aarch64"}


def _emulated(arch: str) -> bool:
    entry = Path("/proc/sys/fs/binfmt_misc") / BINFMT[arch]
    return entry.exists() and entry.read_text().startswith("enabled")


def expect(condition: bool, failure: str) -> None:
    """A check of a built image: its failure stops the build, saying what the image got."""
    if not condition:
        sys.exit(f"check failed: {failure}")


def run(*args: str, capture: bool = False, **kwargs) -> str:
    """``args`` run; their stdout where ``capture``. A failure stops the build with its output."""
    print("+", " ".join(args), flush=True)
    done = subprocess.run(args, text=True, capture_output=capture, env=ENV, **kwargs)
    if done.returncode:
        sys.exit(f"{args[0]} failed ({done.returncode}): {(done.stderr or '')[-2000:]}")
    return done.stdout or ""


def debian_image(arch: str) -> str:
    """The local name ``bootstrap`` gives the base for ``arch``."""
    return f"localhost/debian-{arch}:bookworm-slim"


def local_image(target: str, arch: str | None = None) -> str:
    """The local name of the Dockerfile's ``target``: one architecture's build, or without
    ``arch`` the multi-arch list of them that ``push`` pushes."""
    return f"localhost/flashrt-{target}:{VERSION}" + (f"-{arch}" if arch else "")


def bootstrap(arch: str, mirror: str, work: Path, fresh: bool) -> str:
    """Debian bookworm, ``minbase`` and slim, for ``arch`` as a local image (the one an earlier
    run made, unless ``fresh``); its name."""
    name = debian_image(arch)
    if not fresh and _exists(name):
        return name
    tar = work / f"debian-{arch}.tar"
    hooks = []
    for setting, text in APT_CONFIG.items():
        (work / setting).write_text(text)
        hooks.append(f"--customize-hook=upload {work / setting} /etc/apt/apt.conf.d/{setting}")
    # The merged /usr set up by the hook rather than by the usrmerge package (and the perl it pulls
    # in, 46 MB); apt's caches, which its cleanup misses once docker-clean empties their names.
    hooks += [f"--hook-dir={MERGED_USR_HOOK}", '--customize-hook=rm -f "$1"/var/cache/apt/*.bin']
    run(
        "mmdebstrap", f"--arch={arch}", "--variant=minbase", *(f"--dpkgopt={o}" for o in SLIM), *hooks,
        "bookworm", str(tar), mirror,
    )  # fmt: skip
    container = run("buildah", "from", "scratch", capture=True).strip()
    run("buildah", "add", container, str(tar), "/")
    run("buildah", "config", "--os", "linux", "--arch", arch, "--cmd", '["bash"]', container)
    run("buildah", "commit", "-q", "--rm", container, name)
    tar.unlink()
    return name


def _exists(image: str) -> bool:
    return (
        subprocess.run(["buildah", "inspect", "--type", "image", image], capture_output=True, env=ENV).returncode == 0
    )


def manifest(name: str, images: list[str]) -> None:
    """``images`` listed as the one multi-arch image ``name`` (replacing one of that name)."""
    subprocess.run(["buildah", "manifest", "rm", name], capture_output=True, env=ENV)
    run("buildah", "manifest", "create", name)
    for image in images:
        run("buildah", "manifest", "add", name, image)


def build(target: str, arch: str, debian: str, ca_bundle: Path | None, work: Path) -> str:
    """The Dockerfile's ``target`` for ``arch``; the local image's name."""
    name = local_image(target, arch)
    mounts = []
    if ca_bundle is not None:
        conf = work / "pip.conf"
        conf.write_text("[global]\ncert = /etc/flashrt-build-ca.crt\n")
        mounts = ["-v", f"{ca_bundle}:/etc/flashrt-build-ca.crt:ro", "-v", f"{conf}:/etc/pip.conf:ro"]
    run(
        "buildah", "build", "--layers", "--isolation", "chroot", "--network", "host", "--platform", f"linux/{arch}",
        "--pull=never" if debian == LOCAL_DEBIAN else "--pull=missing", "--build-arg", f"DEBIAN={debian}",
        *mounts, "--target", target, "-t", name, "-f", str(ROOT / "Dockerfile"), str(ROOT),
    )  # fmt: skip
    return name


def repository(prefix: str, target: str) -> str:
    """Where ``push`` puts ``target`` under a registry path ``prefix``."""
    return f"{prefix}/flashrt-{target}"


# The chart's value that names each image.
CHART_KEYS = {"operator": "image", "runtime": "runtimeImage"}


def chart_options(pushed: list[dict]) -> list[str]:
    """The ``helm install`` options that pull what ``push`` pushed, by digest."""
    return [
        f"--set {CHART_KEYS[p['target']]}.repository={p['repository']},{CHART_KEYS[p['target']]}.digest={p['digest']}"
        for p in pushed
    ]


def push(target: str, prefix: str, insecure: bool, work: Path) -> dict:
    """The multi-arch ``target`` pushed, every architecture, to ``prefix``; where and its digest."""
    reference = f"{repository(prefix, target)}:{VERSION}"
    digest = work / f"{target}.digest"
    run(
        "buildah", "manifest", "push", "--all", f"--tls-verify={str(not insecure).lower()}",
        "--digestfile", str(digest), local_image(target), f"docker://{reference}",
    )  # fmt: skip
    return {
        "target": target,
        "reference": reference,
        "repository": repository(prefix, target),
        "digest": digest.read_text().strip(),
    }


def _created(image: str) -> dict:
    info = config(image)
    return {"id": info["FromImageID"], "created": info["OCIv1"].get("created")}


def config(image: str) -> dict:
    return json.loads(run("buildah", "inspect", "--type", "image", image, capture=True))


def in_image(image: str, user: str, command: list[str], *mounts: str) -> str:
    """``command`` run in a container of ``image`` as ``user`` (chroot isolation); its output."""
    container = run("buildah", "from", "--pull=never", image, capture=True).strip()
    try:
        volumes = [arg for m in mounts for arg in ("-v", m)]
        isolation = ("--isolation", "chroot", "--user", user)
        return run("buildah", "run", *isolation, *volumes, container, "--", *command, capture=True)
    finally:
        run("buildah", "rm", container, capture=True)


def pod_config(image: str) -> dict:
    """``image``'s OCI config, once it is checked to run as the pod's user."""
    oci = config(image)["OCIv1"]["config"]
    expect(oci.get("User") == POD_USER, f"{image}: user {oci.get('User')}, the pod runs {POD_USER}")
    return oci


def check_runtime(image: str) -> dict:
    """The runtime image's entrypoint, run as the init container runs it, fills an empty folder
    with the runtime package and the plugin's registration, and nothing compiled."""
    oci = pod_config(image)
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o777)  # an emptyDir: writable by the pod's user
        in_image(image, oci["User"], [*oci["Entrypoint"], BUNDLE_MOUNT], f"{folder}:{BUNDLE_MOUNT}")
        files = {p.relative_to(folder).as_posix(): p for p in Path(folder).rglob("*") if p.is_file()}
        registrations = [p.read_text() for p in files.values() if p.name == "entry_points.txt"]
        registered = any("vllm.general_plugins" in text and "flashrt" in text for text in registrations)
        compiled = [name for name, p in files.items() if p.read_bytes()[:4] == b"\x7fELF"]
    expect("flashrt/runtime/vllm_plugin.py" in files, f"{image}: no runtime package copied")
    expect(registered, f"{image}: no dist-info registering the vLLM plugin")
    expect(not compiled, f"{image}: compiled files {compiled}")
    return {"entrypoint": oci["Entrypoint"], "cmd": oci.get("Cmd"), "files_copied": len(files)}


def check_operator(image: str) -> dict:
    """kopf runs, the handlers import, as the pod's non-root user, and no compiler is on the path."""
    oci = pod_config(image)
    kopf = in_image(image, oci["User"], [*oci["Entrypoint"], "--version"]).strip()
    probe = "import os, flashrt.operator.handlers; print(os.getuid())"
    uid = in_image(image, oci["User"], ["python3", "-c", probe]).strip()
    expect(uid == POD_USER.split(":")[0], f"{image}: ran as uid {uid}")
    found = in_image(
        image, oci["User"], ["sh", "-c", f"for c in {' '.join(COMPILERS)}; do command -v $c; done; true"]
    ).split()
    expect(not found, f"{image}: compilers on the path: {found}")
    return {"entrypoint": oci["Entrypoint"], "kopf": kopf, "uid": int(uid)}


CHECKS = {"runtime": check_runtime, "operator": check_operator}


def record(image: str, arch: str, checked: dict) -> dict:
    info = config(image)
    oci = info["OCIv1"]
    expect(oci["architecture"] == arch, f"{image}: built for {oci['architecture']}, asked for {arch}")
    size = sum(layer.get("size", 0) for layer in json.loads(info["Manifest"]).get("layers", []))
    return {
        "image": image,
        "architecture": arch,
        "id": info["FromImageID"],
        "digest": info["FromImageDigest"],
        "uncompressed_bytes": size,
    } | checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arches", default=",".join(ARCHES), help="architectures to build, of amd64,arm64")
    parser.add_argument("--debian", help="a pullable debian:bookworm-slim; default: bootstrap it from the archive")
    parser.add_argument("--mirror", default="http://deb.debian.org/debian", help="the Debian archive to bootstrap from")
    parser.add_argument("--ca-bundle", type=Path, help="a CA bundle for pip behind a TLS-intercepting proxy")
    parser.add_argument("--fresh-base", action="store_true", help="bootstrap the base again, not reuse the last")
    parser.add_argument("--push", metavar="PREFIX", help="push both multi-arch images under PREFIX (registry/path)")
    parser.add_argument("--insecure", action="store_true", help="with --push: plain HTTP or an unverified certificate")
    parser.add_argument("--out", type=Path, help="where to write what was built (default: build/images.json)")
    args = parser.parse_args(argv)
    arches = args.arches.split(",")
    if unknown := set(arches) - set(ARCHES):
        parser.error(f"--arches: {sorted(unknown)} unknown; use amd64 and/or arm64")
    missing = [tool for tool in ("buildah", *(() if args.debian else ("mmdebstrap",))) if not shutil.which(tool)]
    if missing:
        parser.error(f"{', '.join(missing)} not found: apt-get install buildah mmdebstrap qemu-user-static")
    if os.geteuid() != 0:
        parser.error("buildah's chroot isolation needs root")
    if foreign := [arch for arch in arches if arch != HOST_ARCH.get(os.uname().machine) and not _emulated(arch)]:
        parser.error(
            f"--arches {','.join(foreign)}: this {os.uname().machine} host runs no {foreign[0]} binaries; "
            "apt-get install qemu-user-static (binfmt_misc registers it), or leave it out of --arches"
        )
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    commit += "-dirty" if changed.strip() else ""  # built from what is not that commit
    built: list[dict] = []
    with tempfile.TemporaryDirectory() as work:
        debian = args.debian
        if debian is None:
            manifest(LOCAL_DEBIAN, [bootstrap(arch, args.mirror, Path(work), args.fresh_base) for arch in arches])
            debian = LOCAL_DEBIAN
        for target, check in CHECKS.items():
            images = [build(target, arch, debian, args.ca_bundle, Path(work)) for arch in arches]
            manifest(local_image(target), images)
            built += [record(image, arch, check(image)) for image, arch in zip(images, arches, strict=True)]
        pushed = [push(target, args.push, args.insecure, Path(work)) for target in CHECKS] if args.push else []
    result = {
        "commit": commit,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "buildah": run("buildah", "--version", capture=True).strip(),
        "host": os.uname().machine,
        "debian": args.debian or f"bookworm minbase, slim, from {args.mirror} (mmdebstrap)",
        "debian_images": {arch: _created(debian_image(arch)) for arch in arches} if args.debian is None else {},
        "images": built,
        "pushed": pushed,
    }
    out = args.out or ROOT / "build" / "images.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for image in built:
        print(f"{image['image']}: {image['uncompressed_bytes'] / 1e6:.1f} MB uncompressed, checked")
    for image in pushed:
        print(f"pushed {image['reference']} ({image['digest']})")
    if pushed:
        print("helm install flashrt deploy/helm/flashrt " + " ".join(chart_options(pushed)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
