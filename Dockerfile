# Keelson manager image: a static binary on a minimal non-root base.
# docker build -t keelson:0.1.0 .
FROM rust:1.95-alpine AS build
# make: jemalloc (tikv-jemalloc-sys) is built from source.
RUN apk add --no-cache musl-dev make
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY crates ./crates
RUN cargo build --release --locked --bin keelson \
 && cp target/release/keelson /keelson

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /keelson /keelson
USER 65532:65532
ENTRYPOINT ["/keelson"]
CMD ["run", "--leader-elect", "--log-format=json"]
