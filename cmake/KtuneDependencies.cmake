# Every third-party library ktune links, found once here. scripts/setup.sh installs them all.
find_package(OpenMP REQUIRED)
find_package(Threads REQUIRED)
find_package(dnnl CONFIG REQUIRED)           # libdnnl-dev: the CPU GEMMs
find_package(nlohmann_json CONFIG REQUIRED)  # nlohmann-json3-dev: JSON
find_package(yaml-cpp CONFIG REQUIRED)       # libyaml-cpp-dev: configs and manifests
find_package(GTest CONFIG REQUIRED)          # libgtest-dev
find_package(Gloo CONFIG QUIET)              # libgloo-dev: CPU collectives
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
pkg_check_modules(CURL REQUIRED IMPORTED_TARGET libcurl)
pkg_check_modules(OPENSSL REQUIRED IMPORTED_TARGET openssl)

# Apache Arrow/Parquet C++ is not packaged in Debian 12: the pyarrow wheel ships its headers
# and shared libraries. ktune::arrow is defined only where pyarrow is installed.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import pyarrow; print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
    OUTPUT_VARIABLE _pyarrow_out RESULT_VARIABLE _pyarrow_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_pyarrow_rc EQUAL 0)
    string(REPLACE "\n" ";" _pyarrow_list "${_pyarrow_out}")
    list(GET _pyarrow_list 0 KTUNE_ARROW_INCLUDE)
    list(GET _pyarrow_list 1 KTUNE_ARROW_LIBDIR)
    file(GLOB _arrow_so "${KTUNE_ARROW_LIBDIR}/libarrow.so.*")
    file(GLOB _parquet_so "${KTUNE_ARROW_LIBDIR}/libparquet.so.*")
    if(_arrow_so AND _parquet_so)
      list(GET _arrow_so 0 _arrow_so)
      list(GET _parquet_so 0 _parquet_so)
      add_library(ktune_arrow INTERFACE)
      target_include_directories(ktune_arrow SYSTEM INTERFACE ${KTUNE_ARROW_INCLUDE})
      target_link_libraries(ktune_arrow INTERFACE ${_arrow_so} ${_parquet_so})
      target_link_options(ktune_arrow INTERFACE "-Wl,-rpath,${KTUNE_ARROW_LIBDIR}")
      target_compile_definitions(ktune_arrow INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
      add_library(ktune::arrow ALIAS ktune_arrow)
      message(STATUS "ktune: Arrow/Parquet from pyarrow at ${KTUNE_ARROW_LIBDIR}")
    endif()
  endif()
endif()
