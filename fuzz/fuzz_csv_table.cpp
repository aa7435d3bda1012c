// A CSV file read back as a results table (engine/io/table.h), as the report pages read the
// CSV files of a folder; the table is then written in every format, ragged rows and all.
#include "engine/error.h"
#include "engine/io/table.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = adjoint::fuzz::write_input(data, size, "table.csv");
  try {
    const adjoint::Table table = adjoint::read_csv_table(path, 64);
    (void)table.csv();
    (void)table.markdown();
    (void)table.html();
    (void)adjoint::to_json(table.json());
  } catch (const adjoint::Error&) {
  }
  return 0;
}
