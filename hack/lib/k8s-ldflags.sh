# Sourced by the build scripts: linker flags that stamp a Kubernetes binary
# with its release, so `--version` prints it instead of v0.0.0-master.
k8s_ldflags() { # k8s_ldflags vX.Y.Z
  local ver="$1" minor ld="-s -w" stamp
  minor="$(echo "$ver" | cut -d. -f2)"
  for stamp in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $stamp.gitVersion=$ver -X $stamp.gitMajor=1 -X $stamp.gitMinor=$minor"
    ld+=" -X $stamp.gitTreeState=clean -X $stamp.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ld"
}
