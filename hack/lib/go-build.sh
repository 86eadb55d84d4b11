# Sourced by the build scripts. k8s_ldflags: linker flags that stamp a Kubernetes binary
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

# go_build_module DIR MODULE VERSION OUTPUT: builds the main package at the
# root of MODULE@VERSION from a wrapper module in DIR (modules with replace
# directives cannot be `go install`ed).
go_build_module() {
  local dir="$1" module="$2" version="$3" output="$4"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  printf 'module keelson.local/%s\n\ngo 1.26.0\n' "$(basename "$dir")" > go.mod
  go get "$module@$version" >&2
  go build -trimpath -ldflags "-s -w" -o "$output" "$module"
}
