# Debian packages of an already built tree, with CPack (scripts/package.sh runs it):
#   syrupd        the daemon, its agent, syrupctl, kernel headers and policies under
#                 /usr/share/syrup, the systemd unit, /etc/syrup/syrup.yaml (a conffile)
#   libsyrup0     libsyrup.so.0 (SONAME libsyrup.so.0)
#   libsyrup-dev  headers, libsyrup.so, syrup.pc, the CMake package
# CPack rather than dpkg-buildpackage: it packages the tree the suite has just built
# (install components, no second build), and dpkg-shlibdeps still derives the library
# dependencies. Invariants: every file of a package comes from an install() rule of its
# component; the files only a package has (unit at /lib, conffile, copyright, changelog)
# are EXCLUDE_FROM_ALL, so `cmake --install` never writes to /etc or /lib.
set(SYRUP_DEB_MAINTAINER "Syrup maintainers <syrup@example.org>" CACHE STRING
    "Maintainer field of the Debian packages")
set(SYRUP_DEB_RELEASE 1 CACHE STRING "Debian revision of the packages (VERSION-RELEASE)")
set(SYRUP_DEB_VERSION ${PROJECT_VERSION}-${SYRUP_DEB_RELEASE})
set(SYRUP_DEB_DIR ${CMAKE_BINARY_DIR}/deb)

# Each package's /usr/share/doc/<package>/{copyright,changelog.Debian.gz} (Debian policy 12.5, 12.7).
string(TIMESTAMP SYRUP_DEB_DATE "%a, %d %b %Y 00:00:00 +0000" UTC)
configure_file(${CMAKE_CURRENT_LIST_DIR}/deb/changelog.in ${SYRUP_DEB_DIR}/changelog @ONLY)
execute_process(COMMAND gzip -9nc ${SYRUP_DEB_DIR}/changelog OUTPUT_FILE ${SYRUP_DEB_DIR}/changelog.Debian.gz)
foreach(pkg syrupd libsyrup0 libsyrup-dev)
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/deb/copyright ${SYRUP_DEB_DIR}/changelog.Debian.gz
    DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${pkg} COMPONENT ${pkg} EXCLUDE_FROM_ALL)
endforeach()

# The unit as the package installs it: /usr/sbin/syrupd, in /lib/systemd/system (bookworm).
set(SYRUP_UNIT_SBINDIR /usr/sbin)
set(SYRUP_UNIT_BINDIR /usr/bin)
set(SYRUP_DOC_DIR /usr/share/doc/syrup)
configure_file(${CMAKE_SOURCE_DIR}/packaging/systemd/syrupd.service.in ${SYRUP_DEB_DIR}/syrupd.service @ONLY)
install(FILES ${SYRUP_DEB_DIR}/syrupd.service DESTINATION /lib/systemd/system COMPONENT syrupd EXCLUDE_FROM_ALL)
install(FILES ${CMAKE_SOURCE_DIR}/packaging/syrup.yaml DESTINATION /etc/syrup COMPONENT syrupd EXCLUDE_FROM_ALL)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME syrup)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT ${SYRUP_DEB_MAINTAINER})
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
# Installed with DESTDIR under prefix /usr, so the absolute destinations above land in
# the package and relative ones under /usr, whatever prefix the tree was configured with.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL syrupd libsyrup0 libsyrup-dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_PACKAGE_RELEASE ${SYRUP_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${SYRUP_DEB_MAINTAINER})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_SYRUPD_PACKAGE_NAME syrupd)
set(CPACK_DEBIAN_SYRUPD_PACKAGE_SECTION admin)
# What syrupd runs and compiles policies with (not linked, so not found by dpkg-shlibdeps):
# clang-19, libbpf's BPF headers (1.4, bookworm-backports), the kernel's UAPI and libc's
# headers; groupadd/groupdel and deb-systemd-helper for the maintainer scripts.
set(CPACK_DEBIAN_SYRUPD_PACKAGE_DEPENDS
    "clang-19, libbpf-dev (>= 1:1.4), linux-libc-dev, libc6-dev, passwd, init-system-helpers (>= 1.52)")
set(CPACK_DEBIAN_SYRUPD_PACKAGE_CONTROL_EXTRA
    "${CMAKE_CURRENT_LIST_DIR}/deb/conffiles;${CMAKE_CURRENT_LIST_DIR}/deb/postinst;${CMAKE_CURRENT_LIST_DIR}/deb/prerm;${CMAKE_CURRENT_LIST_DIR}/deb/postrm")
set(CPACK_COMPONENT_SYRUPD_DESCRIPTION "user-defined scheduling policies compiled to eBPF (daemon)
Syrup lets unprivileged local users deploy small C scheduling policies at the
kernel's hooks: XDP, SO_REUSEPORT socket selection, socket lookup and thread
scheduling. The root daemon syrupd compiles them with clang into eBPF, checks
them and loads them; tenants talk to it over a Unix socket.
.
This package contains syrupd, its thread agent, the syrupctl command, the
headers policies compile against, the shipped policies and the systemd unit.")

set(CPACK_DEBIAN_LIBSYRUP0_PACKAGE_NAME libsyrup0)
set(CPACK_DEBIAN_LIBSYRUP0_PACKAGE_SECTION libs)
# Its own shlibs and an ldconfig trigger (CPack's generated ones call ldconfig from
# maintainer scripts and leave shlibs out of a component package).
configure_file(${CMAKE_CURRENT_LIST_DIR}/deb/shlibs.in ${SYRUP_DEB_DIR}/shlibs @ONLY)
set(CPACK_DEBIAN_LIBSYRUP0_PACKAGE_CONTROL_EXTRA "${SYRUP_DEB_DIR}/shlibs;${CMAKE_CURRENT_LIST_DIR}/deb/triggers")
set(CPACK_COMPONENT_LIBSYRUP0_DESCRIPTION "user-defined scheduling policies compiled to eBPF (library)
Syrup lets unprivileged local users deploy small C scheduling policies at the
kernel's hooks through the root daemon syrupd.
.
This package contains libsyrup, the C library applications deploy their
policies and reach their maps with.")

set(CPACK_DEBIAN_LIBSYRUP-DEV_PACKAGE_NAME libsyrup-dev)
set(CPACK_DEBIAN_LIBSYRUP-DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_LIBSYRUP-DEV_PACKAGE_DEPENDS "libsyrup0 (= ${SYRUP_DEB_VERSION})")
set(CPACK_DEBIAN_LIBSYRUP-DEV_PACKAGE_SUGGESTS "syrupd")
set(CPACK_COMPONENT_LIBSYRUP-DEV_DESCRIPTION "user-defined scheduling policies compiled to eBPF (development files)
Syrup lets unprivileged local users deploy small C scheduling policies at the
kernel's hooks through the root daemon syrupd.
.
This package contains the headers of libsyrup and of the policy ABI, the
pkg-config file (libsyrup) and the CMake package (find_package(syrup)).")

include(CPack)
